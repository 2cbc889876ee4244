"""bench/op_count.py counts what a step dispatches: computing operators (not views), and host syncs."""

from __future__ import annotations

import torch

from tests.helpers import load_bench_script


def test_counts_computing_operators_not_views_and_counts_host_syncs():
    op_count = load_bench_script("op_count", "dp_step")
    x = torch.randn(8, 4)

    def views_only() -> None:
        x.view(4, 8).t().unsqueeze(0).detach().squeeze(0)  # (a reshape of the transposed view would copy)

    def three_ops_one_sync() -> None:
        y = (x * 2).sum(1)
        y.t().contiguous()  # a view of a 1-d tensor: no copy
        float(torch.exp(y).max())

    ops, syncs, _, _ = op_count.count(views_only)
    assert (ops, syncs) == (0, 0)
    ops, syncs, _, names = op_count.count(three_ops_one_sync)
    assert syncs == 1
    assert {"aten::mul", "aten::sum", "aten::exp", "aten::max"} <= set(names)
    assert "aten::view" not in names and "aten::t" not in names


def test_a_dp_step_dispatches_more_than_the_non_private_step_and_lean_never_syncs():
    op_count = load_bench_script("op_count", "dp_step")
    plain = op_count.measure("dpcnn", "non-private", 4)
    lean = op_count.measure("dpcnn", "lean-M1", 4)
    assert 0 < plain["ops"] < lean["ops"]
    assert plain["syncs"] == lean["syncs"] == 0

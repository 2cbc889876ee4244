"""Operators dispatched per DP training step, per path and model, counted with torch's profiler on the CPU.

A CUDA step of these small models is bound by kernel launches, not arithmetic: each operator the step
dispatches is at least one launch, and a host synchronisation stalls the launch queue. Both counts are
properties of the code, not of the machine or its load, so they measure progress without a GPU.

- ``ops``: the step's top-level ATen operators (those not called by another ATen operator: what Python, the
  autograd engine or a hook dispatched) that compute something — an operator counts unless it and everything it
  calls are metadata only (views, reshapes without a copy, ``empty``, ``detach``, dtype queries).
- ``syncs`` (in brackets in the table): operators that make a CUDA host wait for the device (``.item()`` /
  ``float(t)`` / ``bool(t)``: ``_local_scalar_dense``; ``nonzero``, ``masked_select``, ``unique``: outputs of
  data-dependent size).

The paths are ``bench/dp_step.py``'s (the same step functions; ``fastdp-*`` only where FastDP is importable).
One warm-up step, then one profiled step; counts do not depend on the seed or the thread count. With
``--device cuda`` the model runs there and a third count is added: ``kernels``, the CUDA kernels the step
launched (the profiler's device events), the number the two above stand in for on the CPU.

    .venv/bin/python bench/op_count.py                                     # four models, batch 32, every path
    .venv/bin/python bench/op_count.py --models dpcnn --paths non-private lean-M1 --top 15   # where they come from
    .venv/bin/python bench/op_count.py --doc docs/performance.md           # regenerate the table in the docs
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import dp_step  # the step functions, shared with the timing benchmark (a script's own folder is on its path)
import torch
from torch.profiler import ProfilerActivity, profile

METADATA = {"aten::" + n for n in (
    "view", "reshape", "_reshape_alias", "_unsafe_view", "as_strided", "t", "transpose", "permute", "expand",
    "expand_as", "unsqueeze", "squeeze", "select", "slice", "narrow", "split", "split_with_sizes", "chunk",
    "unbind", "flatten", "unflatten", "view_as", "alias", "detach", "detach_", "empty", "empty_like",
    "empty_strided", "resize_", "result_type", "resolve_conj", "resolve_neg", "lift_fresh", "to", "_to_copy",
    "contiguous", "numpy_T", "matrix_H", "movedim", "moveaxis", "swapaxes", "unfold", "diagonal", "as_strided_",
    "requires_grad_", "is_nonzero", "size", "stride", "dim", "is_same_size", "_has_compatible_shallow_copy_type",
    "set_", "output_nr", "_version", "retain_grad", "type_as", "_shape_as_tensor", "new_empty", "new_empty_strided")}
SYNCS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique", "aten::_unique2"}


def computes(event) -> bool:
    """Whether the operator or anything it calls does more than metadata (a view that copies counts)."""
    return event.name not in METADATA or any(computes(c) for c in event.cpu_children if c.name.startswith("aten::"))


def count(step, cuda: bool = False) -> tuple[int, int, int, collections.Counter]:
    """(ops, syncs, CUDA kernels, ops by name) of one call of ``step``."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        step()
        if cuda:
            torch.cuda.synchronize()
    names: collections.Counter = collections.Counter()
    syncs = kernels = 0
    for e in prof.events():
        kernels += e.device_type == torch.autograd.DeviceType.CUDA
        if not e.name.startswith("aten::"):
            continue
        syncs += e.name in SYNCS
        parent = e.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if parent is None and computes(e):
            names[e.name] += 1
    return sum(names.values()), syncs, kernels, names


def measure(model_name: str, path: str, batch: int, device: str = "cpu") -> dict:
    torch.manual_seed(0)
    model = dp_step.build(model_name).to(device).eval()
    x, y = (t.to(device) for t in dp_step.inputs(model_name, batch))
    step = dp_step.step_function(path, model_name, model, x, y, batch)
    step()  # warm-up (lazy state, GEP's first anchors)
    ops, syncs, kernels, names = count(step, device.startswith("cuda"))
    row = {"model": model_name, "path": path, "batch": batch, "ops": ops, "syncs": syncs, "top": names.most_common()}
    return row | ({"kernels": kernels} if device.startswith("cuda") else {})


def table(rows: list[dict], models: list[str]) -> str:
    by = {(r["model"], r["path"]): r for r in rows}
    paths = list(dict.fromkeys(r["path"] for r in rows))
    lines = ["| path | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
    for p in paths:
        cells = []
        for m in models:
            r = by.get((m, p))
            kernels = f", {r['kernels']} kernels" if r is not None and "kernels" in r else ""
            cells.append("-" if r is None else r.get("error") or f"{r['ops']} ({r['syncs']}{kernels})")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["dpcnn", "resnet20-gn", "vit", "gpt"],
                        choices=["dpcnn", "resnet20-gn", "vit", "gpt"])
    parser.add_argument("--paths", nargs="+", default=[p for p in dp_step.PATHS if not p.endswith("-bf16")],
                        choices=dp_step.PATHS)
    parser.add_argument("--batch", type=int, default=32, help="batch (one micro-batch)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (also counts the kernels launched)")
    parser.add_argument("--top", type=int, default=0, help="also print each row's N most frequent operators")
    parser.add_argument("--json", help="also write every row to this JSON file")
    parser.add_argument("--from-json", nargs="+", type=Path, help="no measurement: the table of rows these "
                        "--json files hold (pieces of one table measured in parts)")
    parser.add_argument("--doc", type=Path, help="write the table between the op-count markers of this file")
    args = parser.parse_args()
    paths = [p for p in args.paths if not p.startswith("fastdp") or dp_step.fastdp_available()]
    skipped = sorted(set(args.paths) - set(paths))
    if skipped:
        print(f"# skipped (FastDP not importable): {' '.join(skipped)}", flush=True)
    rows = [r for f in args.from_json or () for r in json.loads(f.read_text())["rows"]]
    for m in args.models if not args.from_json else ():
        for p in paths:
            try:
                r = measure(m, p, args.batch, args.device)
            except Exception as exc:  # noqa: BLE001 - a path that cannot run this model is a result
                r = {"model": m, "path": p, "error": f"fails: {type(exc).__name__}"}
            rows.append(r)
            print(f"{m:<12} {p:<20} " + (r.get("error") or f"ops {r['ops']:6d}  syncs {r['syncs']:4d}")
                  + (f"  kernels {r['kernels']:6d}" if "kernels" in r else ""), flush=True)
            for name, n in r.get("top", [])[:args.top]:
                print(f"{'':34}{n:6d} {name}")
    text = table(rows, args.models)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1))
    if args.doc:
        from dpeval.doc_markers import write_into

        write_into(args.doc, "op-count", f"Batch {args.batch} (one micro-batch), torch {torch.__version__}, "
                   f"ops (syncs); `python bench/op_count.py --doc docs/performance.md`.\n\n{text}")


if __name__ == "__main__":
    main()

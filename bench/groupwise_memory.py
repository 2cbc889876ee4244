"""Peak memory (and, indicatively, time) of one DP training step by clipping style, GPT-2-small shape, CPU.

The memory column of the group-wise clipping paper's Table 3 (Bu et al. 2022) and its claim behind it: with
the lean engine's all-layer (flat) clipping must hold every layer's output gradients (and activations) until
the one per-sample norm is known at the end of backprop, so it peaks highest; group-wise styles close a
group, form its clipped sum and free its layers as backprop passes, so they peak lower at about the same
cost.

Rows (clip R = 1, noise σ = 1, SGD lr 0.01; a step = forward + backward + release + update):

- ``non-private``   plain ``loss.backward()`` on the mean loss, no clipping or noise (the reference)
- ``all``, ``layer``, ``param``, ``uniform:4``, ``device:4``, ``boundary:6``: ``groupwise`` (clip_fn abadi)
  on dpeval's lean engine (``train.engine=lean``), driven as ``train()`` drives it
  (``clipped_sum_feeder`` → ``defense.release`` → optimizer step)
- ``opacus-ghost``  Opacus' ghost clipping (``PrivacyEngine.make_private(grad_sample_mode="ghost")``),
  flat clipping (Opacus 1.6; its embedding norm `view`s the ids, so this row makes the position ids
  contiguous: same values)

Model: dpeval's ``gpt`` (token + position Embeddings, causal pre-norm blocks, untied head on the last
token, sequence classification into 4 classes) at depth 12, width 768, heads 12, vocab 50257 (GPT-2 small's
shape, random init: pretrained weights do not change memory or time); a batch of ``--batch`` random token
sequences of length ``--seq-len`` with random labels.

Measured, each row in its own fresh process (so no row sees another's peak): baseline = VmRSS right after
building the model and batch (before the optimizer, defense or Opacus wrapper, whose state counts in the
peak; freed heap is trimmed first); one warm-up step; the peak resident set is then reset
(``/proc/self/clear_refs``) and one step measured: peak = VmHWM after it − baseline (MiB), with its wall
and CPU seconds and the 1-minute load average. glibc's mmap threshold is pinned at 64 KiB in the child so
freed tensors leave the resident set (as ``bench/dp_step.py`` does).

Caveats: CPU only; random weights; one measured step (times are single samples, and indicative only on a
loaded machine — the load average is printed); RSS includes allocator caching and fragmentation, and the
baseline includes the weights (~475 MiB) but not their gradients, which every row's peak includes.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/groupwise_memory.py            # B 8, T 128
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/groupwise_memory.py --batch 4 --rows non-private all layer
    # the largest batch per style that fits 24 GiB, from peaks measured at B = 8 and 32 (fitted as a + b·B)
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/groupwise_memory.py --batch 8 32 --largest 24
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from dp_step import _status_kb  # the /proc/self/status reader of the per-step benchmark beside this file

ROWS = ("non-private", "all", "layer", "param", "uniform:4", "device:4", "boundary:6", "opacus-ghost")
CLASSES = 4


def build(args) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    from dpeval.core.models import build_model
    from dpeval.core.settings import ModelConfig

    torch.manual_seed(0)
    settings = ModelConfig(depth=12, width=768, heads=12, seq_len=args.seq_len, vocab=args.vocab)
    model = build_model("gpt", (1, 1, args.seq_len), CLASSES, [0.0], [1.0], settings=settings).eval()
    x = torch.randint(0, args.vocab, (args.batch, 1, 1, args.seq_len)).float()  # token ids as `tokens` stores them
    y = torch.randint(0, CLASSES, (args.batch,))
    return model, x, y


def step_function(row: str, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor):
    batch = len(y)
    if row == "non-private":
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def step() -> None:
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step
    if row == "opacus-ghost":
        from opacus import PrivacyEngine

        import dpeval.core.models.transformers as transformers
        positions = transformers._positions  # expanded (non-contiguous) ids: Opacus' embedding norm `view`s them
        transformers._positions = lambda h: positions(h).contiguous()  # same values
        model.train()  # Opacus captures activations in training mode (the model has no dropout / batch norm)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch)
        model, opt, criterion, _ = PrivacyEngine().make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01), data_loader=loader,
            criterion=torch.nn.CrossEntropyLoss(), noise_multiplier=1.0, max_grad_norm=1.0,
            grad_sample_mode="ghost", poisson_sampling=False)

        def step() -> None:
            criterion(model(x), y).backward()  # ghost clipping's double backward happens here
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step
    from dpeval.core.per_sample import fixed_front, front_features
    from dpeval.core.streams import Streams
    from dpeval.defenses.base import DefenseContext
    from dpeval.defenses.groupwise import Groupwise, GroupwiseParams
    from dpeval.engine.training import clipped_sum_feeder

    params = dict(model.named_parameters())
    defense = Groupwise(GroupwiseParams(clip=1.0, groups=row, clip_fn="abadi"),
                        DefenseContext({n: p.shape for n, p in params.items()}, 1.0, Streams(0).scope("bench"),
                                       x.device))
    features = front_features(fixed_front(model).front, x)  # as train() feeds the engine
    feed = clipped_sum_feeder("lean", model, defense)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        feed(features, y)
        for name, value in defense.release(batch).grads.items():
            params[name].grad = value
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def measure(args) -> dict:
    model, x, y = build(args)
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # return the build's freed temporaries, so the baseline is stable
    baseline = _status_kb("VmRSS")  # weights and batch; the defense's / optimizer's state counts in the peak
    step = step_function(args.row, model, x, y)
    step()  # warm-up
    warm_peak = _status_kb("VmHWM")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak resident set to the current one
    wall, cpu = time.perf_counter(), time.process_time()
    step()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"row": args.row, "batch": args.batch, "seq_len": args.seq_len, "baseline_mib": baseline / 1024,
            "peak_mib": (_status_kb("VmHWM") - baseline) / 1024, "warmup_peak_mib": (warm_peak - baseline) / 1024,
            "wall_s": wall, "cpu_s": cpu, "load1": os.getloadavg()[0], "threads": torch.get_num_threads()}


def run_row(row: str, batch: int, args) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    cmd = [sys.executable, __file__, "--row", row, "--batch", str(batch), "--seq-len", str(args.seq_len),
           "--vocab", str(args.vocab)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"row": row, "error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else str(out.returncode)}
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(results: list[dict]) -> str:
    ok = {(r["row"], r["batch"]): r for r in results if "error" not in r}
    lines = ["| style | B | T | peak RSS over baseline MiB | × non-private | × all | step wall s | CPU s "
             "| load avg (1 min) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['row']} | | | failed: {r['error']} | | | | | |")
            continue
        ref, flat = ok.get(("non-private", r["batch"])), ok.get(("all", r["batch"]))  # at the same batch
        to_ref, to_flat = (f"{r['peak_mib'] / b['peak_mib']:.2f}" if b else "-" for b in (ref, flat))
        lines.append(f"| {r['row']} | {r['batch']} | {r['seq_len']} | {r['peak_mib']:.1f} | {to_ref} | "
                     f"{to_flat} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['load1']:.2f} |")
    return "\n".join(lines)


def largest(results: list[dict], budget_gib: float) -> str:
    """Per style, peak = a + b·B fitted by least squares over the measured batch sizes; the largest batch whose
    resident set (baseline + peak) fits the budget is ⌊(budget − baseline − a) / b⌋."""
    lines = [f"| style | T | measured B | MiB per sequence (b) | fixed MiB (a) | largest fit residual MiB | "
             f"largest B in {budget_gib:g} GiB |", "|---|---|---|---|---|---|---|"]
    rows = dict.fromkeys(r["row"] for r in results if "error" not in r)
    for row in rows:
        points = [r for r in results if r.get("row") == row and "error" not in r]
        if len({r["batch"] for r in points}) < 2:
            continue
        bs = [float(r["batch"]) for r in points]
        peaks = [r["peak_mib"] for r in points]
        b_mean, p_mean = sum(bs) / len(bs), sum(peaks) / len(peaks)
        slope = sum((b - b_mean) * (p - p_mean) for b, p in zip(bs, peaks)) / sum((b - b_mean) ** 2 for b in bs)
        fixed = p_mean - slope * b_mean
        residual = max(abs(p - fixed - slope * b) for b, p in zip(bs, peaks))
        baseline = max(r["baseline_mib"] for r in points)
        top = int((budget_gib * 1024 - baseline - fixed) // slope)
        lines.append(f"| {row} | {points[0]['seq_len']} | {', '.join(str(int(b)) for b in bs)} | {slope:.1f} | "
                     f"{fixed:.0f} | {residual:.0f} | {top} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", default=list(ROWS), help="styles (and `opacus-ghost`)")
    parser.add_argument("--batch", type=int, nargs="+", default=[8], help="batch sizes, each row at each")
    parser.add_argument("--largest", type=float, metavar="GIB",
                        help="with two or more batch sizes: the largest batch per style whose resident set fits "
                             "GIB, from a linear fit of peak vs B")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--row", help=argparse.SUPPRESS)  # the child: measure one row, print one JSON line
    args = parser.parse_args()
    if args.row:
        args.batch = args.batch[0]
        print(json.dumps(measure(args)))
        return
    if args.largest and len(set(args.batch)) < 2:
        parser.error("--largest needs two or more --batch sizes to fit")
    print(f"# gpt 12/768/12, vocab {args.vocab}, B {args.batch}, T {args.seq_len}; torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}", flush=True)
    results = []
    for batch in args.batch:
        for row in args.rows:
            results.append(run_row(row, batch, args))
            print(json.dumps(results[-1]), flush=True)
    print(table(results))
    if args.largest:
        print()
        print(largest(results, args.largest))


if __name__ == "__main__":
    main()

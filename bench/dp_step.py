"""Time and peak memory of one logical DP training step, every per-sample path side by side in one run.

Paths (all clip to R = 1, noise σ = 1, SGD; a step = every micro-batch of the logical batch + the update):

- ``non-private``   plain autograd, summed loss, no clipping or noise (the reference for the ratios)
- ``opacus``        Opacus hooks (GradSampleModule + DPOptimizer, flat clipping, virtual steps)
- ``func``          dpeval's torch.func path: materialised per-sample gradients → ``dpsgd``
- ``lean-M1``       dpeval's lean engine, flat clipping (``dpsgd``, train.engine=lean)
- ``lean-M2``       lean engine, ``groupwise`` uniform:2 (abadi)
- ``lean-layer``    lean engine, ``groupwise`` layer (abadi)
- ``lean-param``    lean engine, ``groupwise`` param (abadi)
- ``none``, ``rs``, ``random-freeze``, ``adaclip``, ``gep``: each defense on its default engine (lean),
  the step as ``dpeval run`` trains it (RS at rate 0.9, random freeze at its final rate 0.9, GEP with
  its defaults: 200 bases in 3 groups, anchors recomputed every step from 200 public examples)
- ``func-rs``, ``func-random-freeze``, ``func-adaclip``, ``func-gep``: the same on materialised
  per-sample gradients (``train.engine=func``), for the ratio
- ``gep-anchors-reused``: ``gep`` with its anchors computed once and reused (``anchor_every`` huge): the
  lean GEP step without the per-step anchor refresh
- ``fastdp-bk``, ``fastdp-bk-layer``: FastDP's ``PrivacyEngine`` (the group-wise clipping paper's own code,
  awslabs/fast-differential-privacy: book-keeping, ``clipping_mode="MixOpt"``, Abadi clipping at R = 1, σ = 1),
  all-layer and layer-wise; run only where ``import fastDP`` works (it is not a dependency: put its source and
  ``transformers`` on ``PYTHONPATH``, see docs/performance.md), skipped with a line saying so elsewhere
- ``non-private-bf16``, ``func-bf16``: ``non-private`` and ``func`` with the forward and backward passes under
  bfloat16 autocast (``train.precision=bf16``; float32 parameters, clipping and noise), the pair to compare

Models: ``dpcnn``, ``resnet20-gn`` and ``vit`` (its defaults) on 3×32×32 images; ``gpt`` (4 blocks, width 256,
4 heads) on sequences of 64 tokens from a vocabulary of 4,096.

On CPU each (model, path, batch) is measured in fresh Python processes, one for time and one for memory, so
nothing mixes. On CUDA one process per model measures every path in turn (the caching allocator's counters are
exact per allocation, so the paths' peaks do not mix; the CUDA context is made once). A path that fails (out of
memory, an unsupported layer) is reported as failed with its error and the others go on (``--in-process``
does the same on CPU, for a quick look). Peak memory, on CPU: the process's peak resident set during one step
minus its resident set
before it (Linux ``/proc/self/clear_refs`` resets the peak; glibc's mmap threshold is pinned so freed
tensors leave the resident set); on CUDA: ``torch.cuda.max_memory_allocated`` over the step minus what was
allocated before. Time: the median over ``--steps`` steps after one warm-up step (CUDA: synchronised).

    .venv/bin/python bench/dp_step.py                                  # DP-CNN + ResNet-20-GN, batch 256
    .venv/bin/python bench/dp_step.py --models dpcnn --batch 1024 --micro 256 --paths lean-M1 non-private
    OMP_NUM_THREADS=1 .venv/bin/python bench/dp_step.py --interleave --steps 9 --paths non-private func lean-M1
    python bench/dp_step.py --device cuda --models dpcnn resnet20-gn vit gpt --batch 1024 --micro 512 --steps 10 \
        --json dp_step_cuda.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

DEFENSE_PARAMS = {"none": {}, "rs": {"schedule": "constant"}, "random-freeze": {"ramp_epochs": 1}, "adaclip": {},
            "gep": {}}
# (defense, parameters) of paths beyond the defaults: GEP with its anchors computed once (warm-up) and reused,
# which separates the lean step's own cost from the anchor refresh Algorithm 2 makes every step
VARIANTS = {"gep-anchors-reused": ("gep", {"anchor_every": 10**9})}
PATHS = ("non-private", "opacus", "func", "lean-M1", "lean-M2", "lean-layer", "lean-param", *DEFENSE_PARAMS,
         *(f"func-{d}" for d in DEFENSE_PARAMS if d != "none"), *VARIANTS, "fastdp-bk", "fastdp-bk-layer",
         "non-private-bf16", "func-bf16")
GROUPS = {"lean-M2": "uniform:2", "lean-layer": "layer", "lean-param": "param"}
PUBLIC = 200  # public examples for GEP's anchors (the synthetic 2,000-example task's 10% public split)


FASTDP_STYLES = {"fastdp-bk": "all-layer", "fastdp-bk-layer": "layer-wise"}


def fastdp_available() -> bool:
    """Whether FastDP (``fastDP``) imports here: it is measured where it does, skipped elsewhere."""
    try:
        import fastDP  # noqa: F401
    except Exception:  # noqa: BLE001 - absent, or its own imports (transformers) fail: not measurable here
        return False
    return True


GPT = {"depth": 4, "width": 256, "heads": 4, "seq_len": 64, "vocab": 4096}


def build(name: str) -> torch.nn.Module:
    """The benchmarked model: images 3×32×32, 10 classes; ``gpt`` on token sequences (``GPT``)."""
    from dpeval.core.models import build_model
    from dpeval.core.settings import ModelConfig

    if name == "gpt":
        return build_model("gpt", (1, 1, GPT["seq_len"]), 10, [0.0], [1.0], settings=ModelConfig(**GPT))
    return build_model(name, (3, 32, 32), 10, [0.5] * 3, [0.25] * 3)


def inputs(name: str, n: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` random examples for model ``name`` (token ids stored as floats, as the token datasets store them)."""
    if name == "gpt":
        x = torch.randint(0, GPT["vocab"], (n, 1, 1, GPT["seq_len"]), generator=generator).float()
    else:
        x = torch.rand(n, 3, 32, 32, generator=generator)
    return x, torch.randint(0, 10, (n,), generator=generator)


# -- one measurement (runs in a child process) ---------------------------------------------------------
def step_function(path: str, model_name: str, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, micro: int):
    from dpeval.core.per_sample import compute_precision, micro_batches
    from dpeval.core.streams import Streams
    from dpeval.defenses.base import DefenseContext
    from dpeval.defenses.dpsgd import DPSGD, ClipParams
    from dpeval.defenses.groupwise import Groupwise, GroupwiseParams
    from dpeval.engine.training import clipped_sum_feeder

    batch = x.shape[0]
    params = dict(model.named_parameters())
    precision = "bf16" if path.endswith("-bf16") else "fp32"
    path = path.removesuffix("-bf16")
    if path == "non-private":
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def step() -> None:
            for xb, yb in micro_batches(x, y, micro):
                with compute_precision(precision, x.device):
                    loss = F.cross_entropy(model(xb), yb, reduction="sum") / batch
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step
    if path == "opacus":
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        model.train()  # Opacus captures activations only in training mode (no dropout / batch norm here)
        gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum")
        opt = DPOptimizer(torch.optim.SGD(gsm.parameters(), lr=0.01), noise_multiplier=1.0, max_grad_norm=1.0,
                          expected_batch_size=batch, loss_reduction="sum")

        def step() -> None:
            chunks = list(micro_batches(x, y, micro))
            for i, (xb, yb) in enumerate(chunks):
                F.cross_entropy(gsm(xb), yb, reduction="sum").backward()
                opt.signal_skip_step(do_skip=i < len(chunks) - 1)  # what Opacus' BatchMemoryManager does
                opt.step()
                opt.zero_grad(set_to_none=True)
        return step
    if path in FASTDP_STYLES:
        return fastdp_step(model, x, y, micro, FASTDP_STYLES[path])
    shapes = {n: p.shape for n, p in params.items()}
    streams = Streams(0).scope("bench")
    name = path.removeprefix("func-")
    if name in DEFENSE_PARAMS:
        defense = defense_for(name, DEFENSE_PARAMS[name], model_name, model, shapes, streams, x.device)
    elif name in VARIANTS:
        defense = defense_for(*VARIANTS[name], model_name, model, shapes, streams, x.device)
    elif path in GROUPS:
        defense = Groupwise(GroupwiseParams(clip=1.0, groups=GROUPS[path], clip_fn="abadi"),
                            DefenseContext(shapes, 1.0, streams, x.device))
    else:
        defense = DPSGD(ClipParams(clip=1.0), DefenseContext(shapes, 1.0, streams, x.device))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    feed = clipped_sum_feeder("func" if path.startswith("func") else "lean", model, defense, precision)

    def step() -> None:
        for xb, yb in micro_batches(x, y, micro):
            feed(xb, yb)
        for name, value in defense.release(batch).grads.items():
            params[name].grad = value
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def fastdp_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, micro: int, style: str):
    """FastDP's book-keeping step as its README trains: the engine attached to the optimizer, one backward
    per micro-batch of a summed loss (it accumulates the clipped sums), then ``step``."""
    import contextlib
    import io

    from fastDP import PrivacyEngine

    from dpeval.core.per_sample import micro_batches

    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its configuration
        engine = PrivacyEngine(model, batch_size=x.shape[0], sample_size=50_000, epochs=1, noise_multiplier=1.0,
                               max_grad_norm=1.0, clipping_mode="MixOpt", clipping_fn="Abadi",
                               clipping_style=style, loss_reduction="sum", torch_seed_is_fixed=True)
        engine.attach(opt)

    def step() -> None:
        for xb, yb in micro_batches(x, y, micro):
            F.cross_entropy(model(xb), yb, reduction="sum").backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def defense_for(name: str, params: dict, model_name: str, model: torch.nn.Module, shapes: dict, streams,
                device: torch.device):
    """A registered defense at σ = 1 as training uses it, in its last epoch (rates at their final value),
    bound to the model and a public split of random images."""
    from dpeval.core.splits import Split
    from dpeval.defenses import DEFENSES
    from dpeval.defenses.base import DefenseContext

    cls = DEFENSES.get(name)
    defense = cls(cls.Params(**params), DefenseContext(shapes, 1.0, streams, device))
    public = Split(*inputs(model_name, PUBLIC, torch.Generator().manual_seed(1)), torch.arange(PUBLIC))
    defense.bind(model, public, 10)
    defense.begin_epoch(1, 2)
    return defense


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def measure(cfg: dict) -> dict:
    """One (model, path) in this process: ``cfg["mode"]`` time, memory, or (CUDA) both."""
    torch.manual_seed(0)
    device = torch.device(cfg["device"])
    model = build(cfg["model"]).to(device).eval()
    x, y = (t.to(device) for t in inputs(cfg["model"], cfg["batch"]))
    step = step_function(cfg["path"], cfg["model"], model, x, y, cfg["micro"])
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    step()  # warm-up
    sync()
    out = {}
    if cfg["mode"] in ("memory", "both"):
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            step()
            sync()
            out["peak_mb"] = (torch.cuda.max_memory_allocated() - before) / 2**20
        else:
            before = _status_kb("VmRSS") * 1024
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the peak resident set
            step()
            out["peak_mb"] = (_status_kb("VmHWM") * 1024 - before) / 2**20
    if cfg["mode"] in ("time", "both"):
        times = []
        for _ in range(cfg["steps"]):
            sync()
            start = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - start)
        out["time_s"] = statistics.median(times)
    return out


def measure_all(cfg: dict) -> None:
    """Every path of ``cfg["paths"]`` for one model in this process (CUDA): time and memory of each, a failed
    path recorded with its error; one JSON line per path as it is measured."""
    import gc

    for path in cfg["paths"]:
        row = {k: v for k, v in cfg.items() if k != "paths"} | {"path": path}
        try:
            row.update(measure({**row, "mode": "both"}))
        except Exception as exc:  # noqa: BLE001 - one path's failure (OOM, unsupported layer) is a result
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        print(json.dumps(row), flush=True)


def interleaved(cfg: dict) -> list[dict]:
    """Every path of ``cfg["paths"]`` for one model in this process, timed in rounds that visit the paths in
    turn (the order rotating each round), so a shared machine's load falls on all of them alike: ratios measured
    side by side. Time only (the median of ``cfg["steps"]`` rounds, after one warm-up step each)."""
    torch.manual_seed(0)
    steps = {}
    for path in cfg["paths"]:
        model = build(cfg["model"]).eval()
        x, y = inputs(cfg["model"], cfg["batch"])
        steps[path] = step_function(path, cfg["model"], model, x, y, cfg["micro"])
        steps[path]()  # warm-up
    times: dict[str, list[float]] = {p: [] for p in steps}
    order = list(steps)
    for r in range(cfg["steps"]):
        for path in order[r % len(order):] + order[:r % len(order)]:
            start = time.perf_counter()
            steps[path]()
            times[path].append(time.perf_counter() - start)
    return [{k: v for k, v in cfg.items() if k != "paths"} | {"path": p, "time_s": statistics.median(t),
                                                               "peak_mb": float("nan")} for p, t in times.items()]


# -- the driver ------------------------------------------------------------------------------------------
def child(cfg: dict, env: dict | None = None) -> object:
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg)], env=env, capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{cfg['model']} {cfg.get('path', '')} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def stream_child(cfg: dict):
    """The rows of one in-process child (``measure_all``) as it prints them."""
    proc = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(cfg)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("{"):
            yield json.loads(line)
    if proc.wait() != 0:
        raise SystemExit(f"{cfg['model']} failed (exit {proc.returncode})")


def run_child(cfg: dict) -> dict:
    """Time and memory in separate processes: the memory run pins glibc's mmap threshold so freed tensors
    leave the resident set, which would also slow allocation-heavy paths down if timed that way."""
    result = dict(cfg)
    for mode in ("time", "memory"):
        env = dict(os.environ)
        if mode == "memory":
            env["MALLOC_MMAP_THRESHOLD_"] = "65536"
        result.update(child({**cfg, "mode": mode}, env))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["dpcnn", "resnet20-gn"],
                        choices=["dpcnn", "resnet20-gn", "vit", "gpt"])
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    parser.add_argument("--batch", type=int, default=256, help="logical batch size")
    parser.add_argument("--micro", type=int, default=None, help="micro-batch (default: the logical batch)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps (median reported)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--in-process", action="store_true", help="one process per model (always on CUDA)")
    parser.add_argument("--interleave", action="store_true",
                        help="CPU: time every path in one process, in alternating rounds (ratios side by side; no "
                             "memory column)")
    parser.add_argument("--json", help="also write every row (with failures' errors) to this JSON file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        cfg = json.loads(args.child)
        if "paths" in cfg:
            measure_all(cfg)
        else:
            print(json.dumps(measure(cfg)))
        return
    micro = args.micro or args.batch
    device = args.device
    if any(p in FASTDP_STYLES for p in args.paths) and not fastdp_available():
        print(f"# skipped (FastDP not importable): {' '.join(p for p in args.paths if p in FASTDP_STYLES)}")
        args.paths = [p for p in args.paths if p not in FASTDP_STYLES]
    cuda = device.startswith("cuda")
    name = torch.cuda.get_device_name(0) if cuda else platform.processor() or platform.machine()
    print(f"# {name}, {os.cpu_count()} CPUs, torch {torch.__version__}, threads {torch.get_num_threads()}; "
          f"logical batch {args.batch}, micro-batch {micro}, {args.steps} timed steps", flush=True)
    print(f"{'model':<12} {'path':<20} {'s/step':>8} {'×time':>6} {'×opacus':>7} {'peak MiB':>9} {'×mem':>6}")
    every = []
    for model in args.models:
        base = {"model": model, "batch": args.batch, "micro": micro, "steps": args.steps, "device": device}
        if args.interleave and not cuda:
            rows = iter(interleaved({**base, "paths": args.paths}))
        elif cuda or args.in_process:
            rows = stream_child({**base, "paths": args.paths})
        else:
            rows = (run_child({**base, "path": p}) for p in args.paths)
        ref = opacus = None
        for r in rows:
            every.append(r)
            if "error" in r:
                print(f"{model:<12} {r['path']:<20} failed: {r['error']}", flush=True)
                continue
            ref = r if r["path"] == "non-private" else ref  # measured first in PATHS' order
            opacus = r if r["path"] == "opacus" else opacus
            t = f"{r['time_s'] / ref['time_s']:.2f}" if ref else "-"
            o = f"{r['time_s'] / opacus['time_s']:.2f}" if opacus else "-"
            m = f"{r['peak_mb'] / ref['peak_mb']:.2f}" if ref and ref["peak_mb"] == ref["peak_mb"] else "-"
            print(f"{model:<12} {r['path']:<20} {r['time_s']:8.4f} {t:>6} {o:>7} {r['peak_mb']:9.1f} {m:>6}",
                  flush=True)
        if args.json:  # after every model, so a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump({"device": name, "torch": torch.__version__, "rows": every}, f, indent=1)


if __name__ == "__main__":
    main()

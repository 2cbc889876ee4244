"""The lean engine on architectures people train: torchvision's and timm's, at CIFAR-10 size.

Every model is built with random weights for 3×32×32 inputs and 10 classes, batch norm replaced by group norm
where the architecture has it (``norm_layer=`` where the constructor takes one, else every ``BatchNorm*d``
swapped for ``GroupNorm``; one row keeps timm's EfficientNet-B0 as Opacus' ``ModuleValidator.fix`` leaves it).
For each model, one DP-SGD step (R = 1, σ = 1, batch 64, one micro-batch; ``bench/dp_step.py``'s step functions)
on each path — ``non-private`` (plain autograd), ``func`` (torch.func), ``lean`` (the lean engine, ``lean-M1``) and
``opacus`` (``GradSampleModule`` with its default hooks; a failure is recorded with its one-line reason) — and:

- ``s/step``: the process's CPU time per step (``time.process_time``; with one intra-op thread,
  ``torch.set_num_threads(1)``, that is the step's compute, which other jobs on a shared machine inflate far less
  than its wall time: the CSV has both), median of ``--steps`` steps after ``--warmup`` warm-up steps, every path of
  a model in one process, timed in rounds that alternate the paths so what load remains falls on all of them;
- ``peak MiB``: the step's peak resident set over what the process held before it (``/proc/self/clear_refs`` and
  ``VmHWM``, glibc's mmap threshold pinned so freed tensors leave the resident set; a fresh process per path);
- ``noise``: the CPU time of the step's Gaussian noise draw alone (one per parameter), timed in the same rounds:
  each DP path's ratio is also given without it (it does not depend on the batch, so at batch 64 it is a large
  share of a step: no per-sample engine can save it);
- ``norm err``: the per-sample gradient norms of ``func`` and ``lean`` (float32) against a float64 torch.func
  reference on 8 examples, max relative error;
- ``auto``: the engine ``train.engine=auto`` picks on the CPU (``engine_choice``), with its reason when not lean.

    .venv/bin/python bench/zoo.py --quick                                  # a few models, fewer steps
    .venv/bin/python bench/zoo.py --models tv-resnet18-gn timm-vit-tiny --steps 3
    .venv/bin/python bench/zoo.py --doc docs/performance.md                # all, CSV + the table in the docs

timm is an optional extra (``pip install dpeval[zoo]``); its rows are skipped with a line saying so without it.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import dp_step  # the step functions, shared with the DP-step benchmark (a script's own folder is on its path)
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
PATHS = {"non-private": "non-private", "func": "func", "lean": "lean-M1", "opacus": "opacus"}
BATCH = 64
QUICK = ("tv-resnet18-gn", "tv-vit", "timm-convnext-atto", "timm-vit-tiny")


def group_norm(channels: int, groups: int = 8, **kwargs) -> nn.GroupNorm:
    return nn.GroupNorm(math.gcd(groups, channels), channels, **kwargs)


def batch_norms_to_group_norms(model: nn.Module) -> nn.Module:
    """Every ``BatchNorm1d/2d`` (not subclasses with a forward of their own) swapped for a GroupNorm of its
    channels, affine, in place."""
    for name, child in model.named_children():
        if type(child) in (nn.BatchNorm1d, nn.BatchNorm2d):
            setattr(model, name, group_norm(child.num_features))
        else:
            batch_norms_to_group_norms(child)
    return model


def torchvision_models() -> dict:
    import torchvision.models as tv
    from torchvision.models.swin_transformer import SwinTransformer
    from torchvision.models.vision_transformer import VisionTransformer

    def vgg11():
        model = tv.vgg11(num_classes=10)
        # CIFAR's VGG head: ImageNet's (7×7 pooling, 4,096-wide layers, 123M parameters) would need 31 GB of
        # per-sample gradients at batch 64 on the func path
        model.avgpool, model.classifier = nn.AdaptiveAvgPool2d(1), nn.Linear(512, 10)
        return model

    return {
        "tv-resnet18-gn": lambda: tv.resnet18(num_classes=10, norm_layer=functools.partial(group_norm, groups=32)),
        "tv-mobilenet-v3-small-gn": lambda: tv.mobilenet_v3_small(num_classes=10, norm_layer=group_norm),
        "tv-squeezenet1.1": lambda: tv.squeezenet1_1(num_classes=10),
        "tv-vgg11": vgg11,
        "tv-efficientnet-b0-gn": lambda: tv.efficientnet_b0(num_classes=10, norm_layer=group_norm),
        "tv-vit": lambda: VisionTransformer(image_size=32, patch_size=4, num_layers=2, num_heads=3, hidden_dim=192,
                                            mlp_dim=768, num_classes=10),
        "tv-swin": lambda: SwinTransformer(patch_size=[4, 4], embed_dim=48, depths=[2, 2], num_heads=[3, 6],
                                           window_size=[4, 4], num_classes=10),
    }


def timm_models() -> dict:
    import timm
    from timm.layers import GroupNormAct

    def create(name, **kwargs):
        return timm.create_model(name, pretrained=False, num_classes=10, **kwargs)

    def opacus_fixed():
        from opacus.validators import ModuleValidator

        return ModuleValidator.fix(create("efficientnet_b0"))

    return {
        "timm-resnet18-gn": lambda: create("resnet18", norm_layer=functools.partial(group_norm, groups=32)),
        "timm-convnext-atto": lambda: create("convnext_atto"),
        "timm-vit-tiny": lambda: create("vit_tiny_patch16_224", img_size=32, patch_size=8),
        "timm-efficientnet-b0-gn": lambda: create("efficientnet_b0",
                                                  norm_layer=functools.partial(GroupNormAct, num_groups=8)),
        "timm-mixer-s16": lambda: create("mixer_s16_224", img_size=32),
        "timm-resmlp-12": lambda: create("resmlp_12_224", img_size=32),
        "timm-poolformer-s12": lambda: create("poolformer_s12"),
        "timm-levit-128s-gn": lambda: batch_norms_to_group_norms(create("levit_128s", img_size=32)),
        "timm-efficientnet-b0-opacus-fix": opacus_fixed,
    }


def timm_available() -> bool:
    try:
        import timm  # noqa: F401
    except ImportError:
        return False
    return True


def all_models() -> dict:
    return {**torchvision_models(), **(timm_models() if timm_available() else {})}


def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    model = all_models()[name]().eval()
    if name.startswith("timm-levit"):
        # LeViT's attention caches its bias lookup in eval mode (a tensor from the first call, which no engine can
        # differentiate); in training mode it indexes every time. Without batch norm and at drop rate 0 the two
        # modes compute the same function.
        model.train()
    return model


def inputs(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, 32, 32, generator=gen), torch.randint(0, 10, (n,), generator=gen)


def step_function(path: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    return dp_step.step_function(PATHS[path], "zoo", model, x, y, x.shape[0])


# -- one model's measurements (in a child process) --------------------------------------------------------
def per_sample_norms(model: nn.Module, x: torch.Tensor, y: torch.Tensor, engine: str) -> torch.Tensor:
    """Each example's gradient norm on one engine (``dpeval.per_sample_norms`` without its float32 check, so the
    float64 reference runs the same code)."""
    from dpeval.core.per_sample import PerSampleGradients
    from dpeval.defenses.lean_plan import LeanPlan
    from dpeval.engine.lean import LeanEngine

    if engine == "func":
        grads = PerSampleGradients(model)(x, y)
        return torch.stack([g.flatten(1).pow(2).sum(1, dtype=torch.float64) for g in grads.values()]).sum(0).sqrt()
    found = []

    def keep(group, squares, probes):
        found.append(squares)
        return torch.ones_like(squares)

    names = tuple(n for n, p in model.named_parameters() if p.requires_grad)
    LeanEngine(model)(x, y, LeanPlan((names,), keep, sums=False))
    return found[0].sqrt()


def norm_errors(name: str) -> dict:
    """Max relative error of the float32 per-sample norms of func and lean against a float64 func reference."""
    x, y = inputs(8, seed=1)
    out = {}
    reference = per_sample_norms(build(name).double(), x.double(), y, "func").double()
    for engine in ("func", "lean"):
        try:
            got = per_sample_norms(build(name), x, y, engine).double()
            out[f"{engine}_norm_err"] = float(((got - reference).abs() / reference).max())
        except Exception as exc:  # noqa: BLE001 - a refusal is a result
            out[f"{engine}_norm_err"] = float("nan")
            out[f"{engine}_norm_error"] = one_line(exc)
    return out


def auto_choice(model: nn.Module) -> tuple[str, str]:
    from dpeval.core.streams import Streams
    from dpeval.defenses.base import DefenseContext
    from dpeval.defenses.dpsgd import DPSGD, ClipParams
    from dpeval.engine.lean import engine_choice

    shapes = {n: p.shape for n, p in model.named_parameters()}
    return engine_choice("auto", model, DPSGD(ClipParams(), DefenseContext(shapes, 1.0, Streams(0))), "cpu", BATCH)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:240] if text else ''}"


def timed(cfg: dict) -> dict:
    """Every path of one model, interleaved rounds (see the module docstring)."""
    name = cfg["model"]
    x, y = inputs(BATCH)
    model = build(name)
    row = {"model": name, "params": sum(p.numel() for p in model.parameters() if p.requires_grad)}
    row["auto"], row["auto_reason"] = auto_choice(model)
    steps = {}
    for path in cfg["paths"]:
        try:
            step = step_function(path, build(name), x, y)
            for _ in range(cfg["warmup"]):
                step()
            steps[path] = step
        except Exception as exc:  # noqa: BLE001 - an unsupported model is a result
            row[f"{path}_error"] = one_line(exc)
    # the DP step's noise alone (one Gaussian draw per parameter), which no engine can save: the ratio without it
    noise = torch.empty(row["params"])
    steps["noise"] = noise.normal_
    times: dict[str, list[float]] = {p: [] for p in steps}
    walls: dict[str, list[float]] = {p: [] for p in steps}
    order = list(steps)
    for r in range(cfg["steps"]):
        for path in order[r % len(order):] + order[:r % len(order)]:
            start, wall = time.process_time(), time.perf_counter()
            steps[path]()
            times[path].append(time.process_time() - start)
            walls[path].append(time.perf_counter() - wall)
    row.update({f"{p}_s": statistics.median(t) for p, t in times.items()})
    row.update({f"{p}_wall_s": statistics.median(t) for p, t in walls.items()})
    row.update(norm_errors(name))
    return row


def peak(cfg: dict) -> dict:
    """One path's peak resident set over one step (after a warm-up step), in this fresh process."""
    x, y = inputs(BATCH)
    try:
        step = step_function(cfg["path"], build(cfg["model"]), x, y)
        step()
        before = dp_step._status_kb("VmRSS") * 1024
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak resident set
        step()
        return {f"{cfg['path']}_mb": (dp_step._status_kb("VmHWM") * 1024 - before) / 2**20}
    except Exception as exc:  # noqa: BLE001
        return {f"{cfg['path']}_mb_error": one_line(exc)}


def child(cfg: dict, env: dict | None = None) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg)], env=env, capture_output=True,
                         text=True, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"child_error": out.stderr.strip().splitlines()[-1][:240] if out.stderr.strip() else "no output"}
    return json.loads(lines[-1])


# -- the report ---------------------------------------------------------------------------------------------------
COLUMNS = ["model", "params", "auto", "non-private_s", "func_s", "lean_s", "opacus_s", "noise_s", "non-private_wall_s",
           "func_wall_s", "lean_wall_s", "opacus_wall_s", "non-private_mb", "func_mb", "lean_mb", "opacus_mb",
           "func_norm_err", "lean_norm_err", "auto_reason", "func_error", "lean_error", "opacus_error",
           "lean_norm_error"]


def fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def ratio(row: dict, path: str) -> str:
    """``s (×)``: the path's s/step and its ratio to non-private SGD, and for the DP paths the ratio without the
    noise draw (``noise_s``), which a DP step cannot save."""
    v, ref, noise = row.get(f"{path}_s"), row.get("non-private_s"), row.get("noise_s")
    if v is None:
        return "failed" if row.get(f"{path}_error") else "-"
    if not ref:
        return f"{v:.3f}"
    return f"{v:.3f} ({v / ref:.2f}×; {(v - noise) / ref:.2f}×)" if noise else f"{v:.3f} ({v / ref:.2f}×)"


def table(rows: list[dict], header: str) -> str:
    lines = [header, "",
             "| model | params | auto | non-private s | func s (×; × less noise) | lean s (×; × less noise) | "
             "opacus s (×; × less noise) | peak MiB "
             "non-private / func / lean / opacus | norm err func / lean |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mem = " / ".join(fmt(r.get(f"{p}_mb"), 0) for p in PATHS)
        err = " / ".join(f"{r[k]:.1e}" if isinstance(r.get(k), float) and not math.isnan(r[k]) else "-"
                         for k in ("func_norm_err", "lean_norm_err"))
        lines.append(f"| {r['model']} | {r['params'] / 1e6:.2f}M | {r['auto']} | {fmt(r.get('non-private_s'))} | "
                     f"{ratio(r, 'func')} | {ratio(r, 'lean')} | {ratio(r, 'opacus')} | {mem} | {err} |")
    failures: dict[tuple[str, str], list[str]] = {}  # (path, error) -> models: one note per distinct failure
    for r in rows:
        for p in ("lean", "opacus", "func"):
            if r.get(f"{p}_error"):
                error = r[f"{p}_error"].replace('[NotImplementedError("', "")  # Opacus wraps its errors in a list
                cut = error.find("(", 40)  # the module's repr, where the message quotes one
                failures.setdefault((p, error[:cut if cut > 0 else 160][:160].strip()), []).append(r["model"])
    notes = [f"- {p} failed on {', '.join(models)}: {error}" for (p, error), models in failures.items()]
    notes += [f"- {r['model']}: auto → func: {r['auto_reason']}" for r in rows if r["auto"] != "lean"]
    return "\n".join(lines + ([""] + notes if notes else []))


def previous_rows(path: Path, names: list[str]) -> list[dict]:
    """The CSV's rows of a previous run (numbers parsed), so ``--models`` refreshes some rows and keeps the rest."""
    if not path.exists():
        return []
    rows = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            row = {}
            for k, v in raw.items():
                if v == "":
                    continue
                try:
                    row[k] = float(v) if k != "model" and k != "auto" else v
                except ValueError:
                    row[k] = v
            if row.get("model") in names:
                rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", help="model names (default: all; --list shows them)")
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}, 3 steps")
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    parser.add_argument("--steps", type=int, default=5, help="timed rounds (median reported)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--no-memory", action="store_true",
                        help="skip the peak-memory processes (a model's previous memory columns are kept)")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--render", action="store_true", help="measure nothing: the table of the CSV's rows")
    parser.add_argument("--csv", default=str(ROOT / "docs" / "results" / "zoo.csv"))
    parser.add_argument("--doc", help="write the table into this page between <!-- zoo:start/end --> markers")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.child:
        cfg = json.loads(args.child)
        print(json.dumps(peak(cfg) if "path" in cfg else timed(cfg)))
        return
    if not timm_available():
        print("# timm is not installed (pip install dpeval[zoo]): its rows are skipped", flush=True)
    names = list(all_models())
    if args.list:
        print("\n".join(names))
        return
    chosen = args.models or (list(QUICK) if args.quick else names)
    chosen = [n for n in chosen if n in names]
    steps = 3 if args.quick else args.steps
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    header = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
              f"1 intra-op thread, batch {BATCH}, CPU seconds per step (the median of the timed steps); "
              f"`python bench/zoo.py{' --quick' if args.quick else ''}`")
    rows = previous_rows(Path(args.csv), names)
    for name in chosen if not args.render else ():
        row = child({"model": name, "paths": args.paths, "steps": steps, "warmup": args.warmup}, env)
        row.setdefault("model", name)
        row.setdefault("auto", "-")
        row.setdefault("params", float("nan"))
        if not args.no_memory and "child_error" not in row:
            for path in args.paths:
                row.update(child({"model": name, "path": path}, env | {"MALLOC_MMAP_THRESHOLD_": "65536"}))
        elif args.no_memory:  # the memory columns of the CSV's previous row, if any
            old = next((r for r in rows if r["model"] == name), {})
            row.update({k: v for k, v in old.items() if k.endswith(("_mb", "_mb_error"))})
        rows = [r for r in rows if r["model"] != name] + [row]
        rows.sort(key=lambda r: names.index(r["model"]))
        print(json.dumps(row), flush=True)
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        with open(args.csv, "w", newline="") as f:  # after every model: a run cut short keeps what it measured
            writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
    text = table(rows, header)
    print(text)
    if args.doc:
        from dpeval.doc_markers import write_into

        write_into(Path(args.doc), "zoo", text)


if __name__ == "__main__":
    main()

"""One CIFAR-10-size epoch outside dpeval, the reference for ``time.train_s``: a plain non-private PyTorch loop and
Opacus' hooks, on the same model and data shape as the recipes' DP-CNN.

50,000 synthetic 3×32×32 images (on the device), the DP-CNN of the registry, logical batch 1,000 (shuffled,
``--micro`` a physical batch), SGD at lr 1, Opacus at C = 1, σ = 1. Each loop runs two epochs and the second is
timed (the first warms kernels and allocators); one Markdown row per loop. dpeval's own epoch of the same recipe
is ``bench/recipe_epoch.py configs/papers/rs-t2-cifar10-dpcnn-eps3-rs.yaml --size 60000 --device cuda`` (its
50,000 training examples; its epoch also evaluates the 10,000 test images).

    python bench/e2e_epoch.py --device cuda
    .venv/bin/python bench/e2e_epoch.py --size 2000 --threads 1      # a quick look on the CPU
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from dpeval.core.models import build_model


def batches(n: int, batch: int, generator: torch.Generator) -> list[torch.Tensor]:
    order = torch.randperm(n, generator=generator)
    return [order[i:i + batch] for i in range(0, n - batch + 1, batch)]


def plain(model, x, y, batch: int, micro: int, generator: torch.Generator) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    for idx in batches(len(y), batch, generator):
        for chunk in idx.split(micro):
            (F.cross_entropy(model(x[chunk]), y[chunk], reduction="sum") / batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def opacus_loop(model, x, y, batch: int, micro: int, generator: torch.Generator):
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum")
    opt = DPOptimizer(torch.optim.SGD(gsm.parameters(), lr=1.0), noise_multiplier=1.0, max_grad_norm=1.0,
                      expected_batch_size=batch, loss_reduction="sum")

    def epoch(model, x, y, batch, micro, generator) -> None:
        for idx in batches(len(y), batch, generator):
            chunks = idx.split(micro)
            for i, chunk in enumerate(chunks):
                F.cross_entropy(gsm(x[chunk]), y[chunk], reduction="sum").backward()
                opt.signal_skip_step(do_skip=i < len(chunks) - 1)
                opt.step()
                opt.zero_grad(set_to_none=True)
    return epoch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--micro", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(args.size, 3, 32, 32, generator=generator).to(device)
    y = torch.randint(0, 10, (args.size,), generator=generator).to(device)
    print(f"| loop | one epoch of {args.size} (s), {device} |\n|---|---|")
    for name in ("plain", "opacus"):
        torch.manual_seed(0)
        model = build_model("dpcnn", (3, 32, 32), 10, [0.5] * 3, [0.25] * 3).to(device).train()
        epoch = plain if name == "plain" else opacus_loop(model, x, y, args.batch, args.micro, generator)
        epoch(model, x, y, args.batch, args.micro, generator)  # warm-up epoch
        sync()
        start = time.perf_counter()
        epoch(model, x, y, args.batch, args.micro, generator)
        sync()
        print(f"| {name} | {time.perf_counter() - start:.2f} |", flush=True)


if __name__ == "__main__":
    main()

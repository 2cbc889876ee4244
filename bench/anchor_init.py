"""The anchor's published initial parameters and blank target in dpeval's form (Annamalai & De Cristofaro 2024,
code spalabucr/bb-audit-dpsgd): ``pretrained_models/cnn_mnist_half.pt``, their MNIST ``SmallNetwork`` pre-trained
on the other half of MNIST, becomes a state dict of ``tanh-cnn-mnist`` with their input normalisation, and their
blank target (an all-zero image *after* their normalisation, label 9) becomes a target file.

    .venv/bin/python bench/anchor_init.py THEIR_cnn_mnist_half.pt OUT_FOLDER
    dpeval audit --defense dpsgd --scope model --init OUT_FOLDER/init.pt --target OUT_FOLDER/blank.pt \\
        --set model.name=tanh-cnn-mnist --set data.name=mnist ...

Their normalisation is (x − 0.1307) / 0.3081 (``utils/data.py``); dpeval's model starts with a ``Normalize`` whose
buffers ``0.mean`` / ``0.std`` this file sets to those constants, so the network sees exactly their inputs. Their
blank is zero after normalisation: the pixel value 0.1307 everywhere (dpeval's own ``--target blank`` is zero
before normalisation). The file is read tensors-only (``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
NAMES = {"net.conv1": "1.0", "net.conv2": "1.3", "net.fc1": "1.7", "net.fc2": "1.9"}  # theirs -> tanh-cnn-mnist


def convert(theirs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    ours = {"0.mean": torch.full((1, 1, 1), MNIST_MEAN), "0.std": torch.full((1, 1, 1), MNIST_STD)}
    for name, tensor in theirs.items():
        layer, _, kind = name.rpartition(".")
        if layer not in NAMES:
            raise SystemExit(f"{name}: not a parameter of their MNIST SmallNetwork")
        ours[f"{NAMES[layer]}.{kind}"] = tensor.detach().float().clone()
    return ours


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    theirs = torch.load(sys.argv[1], weights_only=True, map_location="cpu")
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    torch.save(convert(theirs), out / "init.pt")
    torch.save({"x": torch.full((1, 28, 28), MNIST_MEAN), "y": torch.tensor(9)}, out / "blank.pt")
    print(f"wrote {out / 'init.pt'} and {out / 'blank.pt'}")


if __name__ == "__main__":
    main()

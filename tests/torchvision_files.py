"""Tiny datasets written in torchvision's real on-disk formats (shared by tests/core/test_data.py and
tests/app/test_recipes.py): MNIST / Fashion-MNIST idx files, CIFAR-10 python batches, SVHN .mat files."""

from __future__ import annotations

import importlib
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest


def write_idx(path: Path, array: np.ndarray) -> None:
    # IDX: 2 zero bytes, type code 0x08 (unsigned byte), number of dims, then big-endian uint32 dims.
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def make_mnist_like(root: Path, folder: str, n_train: int, n_test: int) -> dict[str, np.ndarray]:
    """``folder`` is torchvision's class name (MNIST, FashionMNIST); returns the arrays written."""
    # torchvision 0.2x reads the *uncompressed* files from <root>/<ClassName>/raw/.
    raw = root / folder / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    arrays = {
        "train_x": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train_y": (np.arange(n_train) % 10).astype(np.uint8),
        "test_x": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "test_y": ((np.arange(n_test) * 3) % 10).astype(np.uint8),
    }
    write_idx(raw / "train-images-idx3-ubyte", arrays["train_x"])
    write_idx(raw / "train-labels-idx1-ubyte", arrays["train_y"])
    write_idx(raw / "t10k-images-idx3-ubyte", arrays["test_x"])
    write_idx(raw / "t10k-labels-idx1-ubyte", arrays["test_y"])
    return arrays


def make_cifar10(root: Path, per_batch: int, n_test: int) -> dict[str, tuple[np.ndarray, list[int]]]:
    """cifar-10-batches-py/ with 5 training batches of ``per_batch`` images, a test batch and the meta file;
    returns {batch name: (data rows, labels)}."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    batches = {}
    for name, n in [(f"data_batch_{i}", per_batch) for i in range(1, 6)] + [("test_batch", n_test)]:
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)  # rows: 1024 R, 1024 G, 1024 B
        labels = rng.integers(0, 10, n).tolist()
        batches[name] = (data, labels)
        with open(folder / name, "wb") as f:
            pickle.dump({"data": data, "labels": labels}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)
    return batches


def make_svhn(root: Path, n_train: int, n_test: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """train_32x32.mat and test_32x32.mat; returns {split: (X as H x W x C x N, labels 1..10)}."""
    from scipy.io import savemat

    rng = np.random.default_rng(2)
    raw = {}
    for split, n in (("train", n_train), ("test", n_test)):
        x = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)  # H x W x C x N, as in the real files
        y = (np.arange(n) % 10 + 1).astype(np.uint8).reshape(n, 1)  # SVHN labels are 1..10 (10 = digit 0)
        savemat(root / f"{split}_32x32.mat", {"X": x, "y": y})
        raw[split] = (x, y[:, 0])
    return raw


def skip_md5(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    # Only the checksum is faked: the fake files cannot match the real datasets' md5 sums, so the
    # integrity check is reduced to "the file exists". Everything else is torchvision's real code.
    mod = importlib.import_module(f"torchvision.datasets.{module}")
    monkeypatch.setattr(mod, "check_integrity", lambda fpath, md5=None: os.path.isfile(fpath))

"""The torchvision image datasets read from ``data.root``: MNIST, Fashion-MNIST (both from their idx files,
also found in a system folder such as Debian's), CIFAR-10 and SVHN.

A failure while *downloading* (``data.download=true``) raises :class:`RunFailure` (exit code 1: a
runtime/network problem, not bad input); missing or unreadable files with download off raise
:class:`ConfigError` (exit code 2).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any, Callable

import torch

from dpeval.core.datasets._common import abs_root, one_line
from dpeval.core.errors import ConfigError, RunFailure
from dpeval.core.registry import DATASETS
from dpeval.core.settings import DataConfig
from dpeval.core.splits import Task, assemble


def _open_torchvision(
    cfg: DataConfig, label: str, root: Path, folder: Path, files: list[str], build: Callable[[], Any]
) -> Any:
    """Construct a torchvision dataset, turning its failures into one-line harness errors.

    ``folder`` / ``files`` describe where torchvision looks, so the message can say exactly what
    to put where.
    """
    try:
        return build()
    except Exception as exc:  # torchvision raises RuntimeError, OSError, pickle/struct errors...
        detail = one_line(f"{type(exc).__name__}: {exc}")
        if cfg.download:
            raise RunFailure(
                f"data.download: fetching {label} into {root} failed ({detail}); check network "
                f"access or place the files in {folder} and set data.download=false"
            ) from None
        missing = [f for f in files if not (folder / f).is_file()]
        if missing:
            what = (
                f"expected {folder} containing {', '.join(files)}"
                if len(missing) == len(files)
                else f"{folder} lacks {', '.join(missing)}"
            )
            raise ConfigError(
                f"data.root: {label} not found under {root} ({what}); place it there or pass "
                f"--set data.download=true (needs network)"
            ) from None
        raise ConfigError(
            f"data.root: {label} files in {folder} could not be read or failed their checksum "
            f"({detail}); replace them or pass --set data.download=true (needs network)"
        ) from None


# Where a system keeps MNIST-family files when ``data.root`` does not hold them, searched in this order after
# ``data.root/<ClassName>/raw/``. Debian and Ubuntu ship Fashion-MNIST as the package ``dataset-fashion-mnist``:
# Zalando's four gzip-compressed idx files, as published, in the folder below. No other image data set is packaged.
SYSTEM_FOLDERS: dict[str, tuple[Path, ...]] = {
    "FashionMNIST": (Path("/usr/share/datasets/fashion-mnist"),),
}
SYSTEM_PACKAGES = {"FashionMNIST": "dataset-fashion-mnist"}
MNIST_FILES = [f"{p}-{k}-ubyte" for p in ("train", "t10k") for k in ("images-idx3", "labels-idx1")]
IDX_UBYTE = 0x08


def _idx_path(folder: Path, stem: str) -> Path | None:
    """``folder/stem`` as torchvision extracts it, else ``folder/stem.gz`` as published; None if neither."""
    for path in (folder / stem, folder / f"{stem}.gz"):
        if path.is_file():
            return path
    return None


def read_idx(path: Path) -> torch.Tensor:
    """An idx file of unsigned bytes (plain or gzip-compressed): ``uint8`` tensor of its declared shape.

    Format: two zero bytes, type code 0x08, the number of dimensions, big-endian uint32 sizes, the data.
    Anything else (another type code, a size that does not match the bytes) raises ``ValueError``.
    """
    import gzip

    import numpy as np

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != IDX_UBYTE or raw[3] == 0:
        raise ValueError(f"{path.name} is not an idx file of unsigned bytes")
    ndim = raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    if len(raw) < header or len(raw) - header != math.prod(shape):
        raise ValueError(f"{path.name} holds {len(raw) - header} data bytes, its header declares {shape}")
    return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape).copy())


def _read_mnist_folder(folder: Path, files: dict[str, Path],
                       label: str) -> dict[bool, tuple[torch.Tensor, torch.Tensor]]:
    parts = {}
    for train, prefix in ((True, "train"), (False, "t10k")):
        try:
            x = read_idx(files[f"{prefix}-images-idx3-ubyte"])
            y = read_idx(files[f"{prefix}-labels-idx1-ubyte"])
        except (OSError, EOFError, ValueError) as exc:
            raise ConfigError(f"data.root: {label} files in {folder} could not be read "
                              f"({one_line(f'{type(exc).__name__}: {exc}')}); replace them") from None
        if x.dim() != 3 or y.dim() != 1 or x.shape[0] != y.shape[0] or (len(y) > 0 and int(y.max()) > 9):
            raise ConfigError(f"data.root: {label} files in {folder} could not be read (images {tuple(x.shape)}, "
                              f"labels {tuple(y.shape)}: expected N x H x W images, N labels 0..9); replace them")
        parts[train] = (x.unsqueeze(1), y.long())  # N x 1 x H x W
    return parts


def _mnist_like(cfg: DataConfig, class_name: str) -> Task:
    """MNIST-family idx files, searched in ``data.root/<ClassName>/raw/`` (plain or .gz) and then in the system
    folders of ``SYSTEM_FOLDERS``; fetched into ``data.root`` by torchvision only with ``data.download``."""
    root = abs_root(cfg)
    folder = root / class_name / "raw"
    found = {stem: _idx_path(folder, stem) for stem in MNIST_FILES}
    if any(found.values()) and not all(found.values()):
        missing = [s for s, p in found.items() if p is None]
        raise ConfigError(f"data.root: {class_name} not found under {root} ({folder} lacks {', '.join(missing)}); "
                          f"complete it, or remove it to use a system copy")
    if not all(found.values()):
        for system in SYSTEM_FOLDERS.get(class_name, ()):
            found_there = {stem: _idx_path(system, stem) for stem in MNIST_FILES}
            if all(found_there.values()):
                folder, found = system, found_there
                break
    if not all(found.values()):
        if not cfg.download:
            searched = [str(folder), *(str(p) for p in SYSTEM_FOLDERS.get(class_name, ()))]
            package = SYSTEM_PACKAGES.get(class_name)
            how = f"install Debian's package {package} (apt-get install {package}), " if package else ""
            raise ConfigError(
                f"data.root: {class_name} not found under {root} (expected {folder} containing "
                f"{', '.join(MNIST_FILES)}, plain or .gz; searched {', '.join(searched)}); {how}place the files "
                f"there or pass --set data.download=true (needs network)"
            )
        import torchvision.datasets as tvd

        for train in (True, False):
            build = functools.partial(getattr(tvd, class_name), str(root), train=train, download=True)
            _open_torchvision(cfg, class_name, root, folder, MNIST_FILES, build)
        found = {stem: _idx_path(folder, stem) for stem in MNIST_FILES}
    parts = _read_mnist_folder(folder, found, class_name)  # type: ignore[arg-type]
    return assemble(cfg, 10, *parts[True], *parts[False])


@DATASETS.register("mnist", "MNIST handwritten digits via torchvision from data.root (1x28x28, 10 classes)",
                   default_model="dpcnn-small")
def _load_mnist(cfg: DataConfig) -> Task:
    return _mnist_like(cfg, "MNIST")


@DATASETS.register(
    "fashionmnist",
    "Fashion-MNIST clothing images from data.root, else Debian's dataset-fashion-mnist (1x28x28, 10 classes)",
    default_model="dpcnn-small",
)
def _load_fashionmnist(cfg: DataConfig) -> Task:
    return _mnist_like(cfg, "FashionMNIST")


@DATASETS.register("cifar10", "CIFAR-10 natural images via torchvision from data.root (3x32x32, 10 classes)",
                   default_model="dpcnn")
def _load_cifar10(cfg: DataConfig) -> Task:
    import torchvision.datasets as tvd

    root = abs_root(cfg)
    folder = root / tvd.CIFAR10.base_folder
    files = [f for f, _ in tvd.CIFAR10.train_list + tvd.CIFAR10.test_list] + [tvd.CIFAR10.meta["filename"]]
    parts = {}
    for train in (True, False):
        build = functools.partial(tvd.CIFAR10, str(root), train=train, download=cfg.download)
        ds = _open_torchvision(cfg, "CIFAR10", root, folder, files, build)
        # .data is a uint8 numpy array N x H x W x C.
        parts[train] = (torch.from_numpy(ds.data).permute(0, 3, 1, 2), torch.as_tensor(ds.targets).long())
    return assemble(cfg, 10, *parts[True], *parts[False])


@DATASETS.register(
    "svhn", "SVHN street-view house numbers via torchvision from data.root (3x32x32, 10 classes)",
    default_model="dpcnn",
)
def _load_svhn(cfg: DataConfig) -> Task:
    import torchvision.datasets as tvd

    root = abs_root(cfg)
    files = [tvd.SVHN.split_list[s][1] for s in ("train", "test")]
    parts = {}
    for split in ("train", "test"):
        build = functools.partial(tvd.SVHN, str(root), split=split, download=cfg.download)
        ds = _open_torchvision(cfg, "SVHN", root, root, files, build)
        # .data is uint8 N x C x H x W; torchvision already maps the digit-0 label 10 to 0.
        parts[split] = (torch.from_numpy(ds.data), torch.from_numpy(ds.labels).long())
    return assemble(cfg, 10, *parts["train"], *parts["test"])

"""The torchvision image datasets read from ``data.root``: MNIST, Fashion-MNIST (both from their idx files), CIFAR-10
and SVHN; MNIST and CIFAR-10 also from dpeval's data folder (``dpeval data install``, ``packaged.py``), Fashion-MNIST
also from a system folder such as Debian's.

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

from dpeval.core.datasets import packaged
from dpeval.core.datasets._common import abs_root, one_line
from dpeval.core.errors import ConfigError, RunFailure
from dpeval.core.files import open_regular
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


# The largest idx payload read (bytes): MNIST's training images are 47 MB, EMNIST's largest 0.7 GB. A header that
# declares more is refused before anything is allocated, and a compressed file is never inflated past its header.
MAX_IDX_BYTES = 2**31


def read_idx(path: Path, sha256: str | None = None) -> torch.Tensor:
    """An idx file of unsigned bytes (plain or gzip-compressed): ``uint8`` tensor of its declared shape.

    Format: two zero bytes, type code 0x08, the number of dimensions, big-endian uint32 sizes, the data. Reads the
    header, then exactly the bytes it declares: anything else (another type code, fewer or more bytes than the
    header declares, a payload over ``MAX_IDX_BYTES``, a damaged gzip stream, a file that is no regular file)
    raises ``ValueError`` naming the file, before the data is used. With ``sha256``, the file's content (as
    uncompressed) must have that digest.
    """
    import gzip
    import hashlib
    import zlib
    from contextlib import nullcontext

    import numpy as np

    try:
        with open_regular(path) as raw, (gzip.GzipFile(fileobj=raw) if path.suffix == ".gz" else nullcontext(raw)) as f:
            magic = f.read(4)
            if len(magic) < 4 or magic[0] != 0 or magic[1] != 0 or magic[2] != IDX_UBYTE or magic[3] == 0:
                raise ValueError(f"{path.name} is not an idx file of unsigned bytes")
            sizes = f.read(4 * magic[3])
            shape = tuple(int.from_bytes(sizes[4 * i:4 * i + 4], "big") for i in range(len(sizes) // 4))
            if len(shape) != magic[3]:
                raise ValueError(f"{path.name} ends inside its header")
            declared = math.prod(shape)
            if declared > MAX_IDX_BYTES:
                raise ValueError(f"{path.name} declares {declared} bytes of data (more than {MAX_IDX_BYTES})")
            data = f.read(declared)
            extra = f.read(1)
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError; a FIFO a NotRegularFile
        raise ValueError(f"{path.name}: {getattr(exc, 'strerror', None) or f'{type(exc).__name__}: {exc}'}") from None
    if len(data) != declared or extra:
        raise ValueError(f"{path.name} holds {'more' if extra else len(data)} data bytes, its header declares "
                         f"{shape}")
    if sha256 is not None and hashlib.sha256(magic + sizes + data).hexdigest() != sha256:
        raise ValueError(f"{path} is damaged or not the published file (its SHA-256 differs)")
    return torch.from_numpy(np.frombuffer(data, dtype=np.uint8).reshape(shape).copy())


def _read_mnist_folder(folder: Path, files: dict[str, Path], label: str,
                       digests: dict[str, str] | None = None) -> dict[bool, tuple[torch.Tensor, torch.Tensor]]:
    """The train and test parts of an MNIST-family folder; ``digests`` (file stem -> SHA-256) for an installed
    copy, whose content must be the published files'."""
    parts = {}
    for train, prefix in ((True, "train"), (False, "t10k")):
        stems = f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"
        try:
            x, y = (read_idx(files[s], (digests or {}).get(s)) for s in stems)
        except ValueError as exc:
            how = f"reinstall with `dpeval data install {label.lower()} --force`" if digests else "replace them"
            raise ConfigError(f"data.root: {label} files in {folder} could not be read "
                              f"({one_line(str(exc))}); {how}") from None
        if x.dim() != 3 or y.dim() != 1 or x.shape[0] != y.shape[0] or (len(y) > 0 and int(y.max()) > 9):
            raise ConfigError(f"data.root: {label} files in {folder} could not be read (images {tuple(x.shape)}, "
                              f"labels {tuple(y.shape)}: expected N x H x W images, N labels 0..9); replace them")
        parts[train] = (x.unsqueeze(1), y.long())  # N x 1 x H x W
    if parts[True][0].shape[1:] != parts[False][0].shape[1:]:
        raise ConfigError(f"data.root: {label} files in {folder} disagree: training images "
                          f"{tuple(parts[True][0].shape[2:])}, test images {tuple(parts[False][0].shape[2:])}; "
                          f"replace them")
    return parts


def _mnist_like(cfg: DataConfig, class_name: str) -> Task:
    """MNIST-family idx files, searched in ``data.root/<ClassName>/raw/`` (plain or .gz), then in dpeval's data
    folder (``dpeval data install``, verified by SHA-256 at every read) and then in the system folders of
    ``SYSTEM_FOLDERS``; fetched into ``data.root`` by torchvision only with ``data.download``."""
    root = abs_root(cfg)
    folder = root / class_name / "raw"
    found = {stem: _idx_path(folder, stem) for stem in MNIST_FILES}
    digests = None
    if any(found.values()) and not all(found.values()):
        missing = [s for s, p in found.items() if p is None]
        raise ConfigError(f"data.root: {class_name} not found under {root} ({folder} lacks {', '.join(missing)}); "
                          f"complete it, or remove it to use an installed or system copy")
    package = packaged.PACKAGES.get(class_name.lower())
    searched = [folder]
    if not all(found.values()) and package is not None:
        installed = packaged.data_home() / package.folder
        searched.append(installed)
        if packaged.installed_folder(package) is not None:
            folder, found, digests = installed, {s: installed / s for s in MNIST_FILES}, package.files
    if not all(found.values()):
        for system in SYSTEM_FOLDERS.get(class_name, ()):
            searched.append(system)
            found_there = {stem: _idx_path(system, stem) for stem in MNIST_FILES}
            if all(found_there.values()):
                folder, found = system, found_there
                break
    if not all(found.values()):
        if not cfg.download:
            system_package = SYSTEM_PACKAGES.get(class_name)
            how = (f"{packaged.install_hint(package.name)}, " if package is not None else
                   f"install Debian's package {system_package} (apt-get install {system_package}), "
                   if system_package else "")
            raise ConfigError(
                f"data.root: {class_name} not found (searched {', '.join(map(str, searched))}); {how}place "
                f"{', '.join(MNIST_FILES)} (plain or .gz) in {root / class_name / 'raw'} or pass "
                f"--set data.download=true (needs network)"
            )
        import torchvision.datasets as tvd

        folder = root / class_name / "raw"
        for train in (True, False):
            build = functools.partial(getattr(tvd, class_name), str(root), train=train, download=True)
            _open_torchvision(cfg, class_name, root, folder, MNIST_FILES, build)
        found = {stem: _idx_path(folder, stem) for stem in MNIST_FILES}
    parts = _read_mnist_folder(folder, found, class_name, digests)  # type: ignore[arg-type]
    return assemble(cfg, 10, *parts[True], *parts[False])


@DATASETS.register("mnist", "MNIST handwritten digits from data.root, else `dpeval data install mnist` (1x28x28, "
                   "10 classes)",
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


@DATASETS.register("cifar10", "CIFAR-10 natural images from data.root, else `dpeval data install cifar10` (3x32x32, "
                   "10 classes)", default_model="dpcnn")
def _load_cifar10(cfg: DataConfig) -> Task:
    """torchvision's ``cifar-10-batches-py`` under ``data.root`` (also what ``data.download`` fetches), else the copy
    ``dpeval data install cifar10`` put in dpeval's data folder, verified by SHA-256 at every read."""
    import torchvision.datasets as tvd

    root = abs_root(cfg)
    folder = root / tvd.CIFAR10.base_folder
    files = [f for f, _ in tvd.CIFAR10.train_list + tvd.CIFAR10.test_list] + [tvd.CIFAR10.meta["filename"]]
    installed = packaged.installed_folder(packaged.CIFAR10)
    if not cfg.download and not any((folder / f).exists() for f in files):
        if installed is None:
            raise ConfigError(
                f"data.root: CIFAR10 not found (searched {folder}, {packaged.data_home() / packaged.CIFAR10.folder}); "
                f"{packaged.install_hint('cifar10')}, place torchvision's {tvd.CIFAR10.base_folder} in {root} or "
                f"pass --set data.download=true (needs network)")
        arrays = packaged.load_cifar10_arrays(installed)
        images = {s: torch.from_numpy(arrays[f"{s}_images"]).permute(0, 3, 1, 2) for s in ("train", "test")}
        labels = {s: torch.from_numpy(arrays[f"{s}_labels"]).long() for s in ("train", "test")}
        return assemble(cfg, 10, images["train"], labels["train"], images["test"], labels["test"])
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

"""Dataset loaders, registered by name: the embedded digits and synthetic data, torchvision datasets
read from ``data.root`` and the user's own image folder. Each loader returns a ``Task`` split by
``harness.core.splits.assemble`` (see that module for the roles and the split rules).

Other choices
-------------
* ``synthetic``: labels are ``i % classes`` (exactly balanced up to one example), images are one
  uniform[0, 1] prototype per class plus N(0, 0.15^2) noise, clipped to [0, 1], all generated from a
  generator seeded with ``split_seed``.
* ``tokens``: sequences of ``data.tokens.length`` token ids; class k has one prototype sequence drawn
  uniformly from the vocabulary, each example is its class's prototype with every token redrawn uniformly
  with probability ``data.tokens.noise`` (labels ``i % classes``), all from a generator seeded with
  ``split_seed``. A token dataset stores x as float token ids of shape (1, 1, T) with identity
  normalisation (mean 0, std 1) and ``Task.vocab`` set; token models (``gpt``) round them back to ids.
* ``textfile``: ``data.root`` names a local file read as bytes (vocabulary 256); it is cut into
  non-overlapping windows of ``data.tokens.length + 1`` bytes, x the first ``length`` bytes and the class
  the last one (next-byte prediction as 256-way classification); the remainder is dropped.
* ``data.synthetic.*`` is validated only when ``data.name == "synthetic"``; all other fields are
  validated for every dataset, even where unused (``image_size``; and ``test_fraction +
  public_fraction < 1`` holds for official-test datasets too, where ``test_fraction`` is ignored).
* ``data.split_seed`` must be an integer in ``[0, 2**63)``.
* ``imagefolder`` needs at least 2 class folders, each with at least one image; hidden folders and
  files (names starting with ".") are skipped; images are converted to RGB, their shorter side is
  resized to ``image_size`` (antialiased) and then centre-cropped to ``image_size x image_size``.
* A failure while *downloading* (``data.download=true``) raises :class:`RunFailure` (exit code 1:
  a runtime/network problem, not bad input); missing or unreadable files with download off raise
  :class:`ConfigError` (exit code 2).
* ``Split`` and ``Task`` compare by identity (``eq=False``): field-wise ``==`` on tensors is
  ambiguous, so the generated ``__eq__`` would raise.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
from pathlib import Path
from typing import Any, Callable

import torch

from harness.core.errors import ConfigError, RunFailure, brief
from harness.core.registry import DATASETS
from harness.core.settings import DataConfig
from harness.core.splits import Task, assemble

SYNTHETIC_NOISE_STD = 0.15
MIN_IMAGE_SIZE = 4

Loader = Callable[[DataConfig], Task]


# --------------------------------------------------------------------------- validation


def _is_int(v: Any) -> bool:
    # bool is an int subclass, but `max_train: true` in YAML is a mistake, not 1.
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def validate_data_config(cfg: DataConfig) -> None:
    """Raise ConfigError (naming the field) for anything ``load_task`` cannot honour.

    Checks the dataset name, the generic fields, and ``data.synthetic`` when it is in use. Whether
    the private pool ends up non-empty depends on the dataset size, so ``load_task`` checks that.
    """
    if not isinstance(cfg.name, str):
        raise ConfigError(f"data.name: must be a dataset name string, got {brief(cfg.name)}")
    DATASETS.get(cfg.name, field="data.name")
    if not isinstance(cfg.root, (str, os.PathLike)) or str(cfg.root) == "":
        raise ConfigError(f"data.root: must be a non-empty path, got {brief(cfg.root)}")
    if not isinstance(cfg.download, bool):
        raise ConfigError(f"data.download: must be true or false, got {brief(cfg.download)}")
    # Upper bound: torch.Generator.manual_seed accepts at most 64-bit values.
    if not _is_int(cfg.split_seed) or not 0 <= cfg.split_seed < 2**63:
        raise ConfigError(f"data.split_seed: must be an integer in [0, 2**63), got {brief(cfg.split_seed)}")
    for field in ("test_fraction", "public_fraction"):
        v = getattr(cfg, field)
        # `not (0 <= v < 1)` also rejects NaN.
        if not _is_real(v) or not (0 <= v < 1):
            raise ConfigError(f"data.{field}: must be in [0, 1), got {brief(v)}")
    if not cfg.test_fraction + cfg.public_fraction < 1:
        raise ConfigError(
            f"data.test_fraction + data.public_fraction: must sum to < 1 so examples remain for the "
            f"private pool, got {cfg.test_fraction} + {cfg.public_fraction}"
        )
    if not _is_int(cfg.max_train) or cfg.max_train < 0:
        raise ConfigError(f"data.max_train: must be an integer >= 0 (0 = no cap), got {brief(cfg.max_train)}")
    if not _is_int(cfg.image_size) or cfg.image_size < MIN_IMAGE_SIZE:
        raise ConfigError(f"data.image_size: must be an integer >= {MIN_IMAGE_SIZE}, got {brief(cfg.image_size)}")
    if cfg.name == "tokens" and cfg.tokens.size < cfg.tokens.classes:
        raise ConfigError(f"data.tokens.size: must be >= data.tokens.classes ({cfg.tokens.classes}), got "
                          f"{brief(cfg.tokens.size)}")
    if cfg.name == "synthetic":
        syn = cfg.synthetic
        shape = syn.shape
        if (
            not isinstance(shape, (list, tuple))
            or len(shape) != 3
            or not all(_is_int(s) and s > 0 for s in shape)
        ):
            raise ConfigError(f"data.synthetic.shape: must be 3 positive integers [C, H, W], got {brief(shape)}")
        if not _is_int(syn.classes) or syn.classes < 2:
            raise ConfigError(f"data.synthetic.classes: must be an integer >= 2, got {brief(syn.classes)}")
        if not _is_int(syn.size) or syn.size < syn.classes:
            raise ConfigError(
                f"data.synthetic.size: must be an integer >= data.synthetic.classes ({syn.classes}), "
                f"got {brief(syn.size)}"
            )


def load_task(cfg: DataConfig) -> Task:
    """Validate ``cfg`` and load the dataset it names, split into train / test / public."""
    validate_data_config(cfg)
    return DATASETS.get(cfg.name, field="data.name")(cfg)


# --------------------------------------------------------------------------- splitting



def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _abs_root(cfg: DataConfig) -> Path:
    return Path(os.path.expanduser(str(cfg.root))).resolve()


# --------------------------------------------------------------------------- embedded datasets


@DATASETS.register(
    "digits", "scikit-learn's bundled 8x8 handwritten digits (1797 images, 10 classes; offline default)"
)
def _load_digits(cfg: DataConfig) -> Task:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    # Pixel values are integers 0..16.
    x = torch.from_numpy(bunch.images).float().div_(16.0).unsqueeze(1)
    y = torch.from_numpy(bunch.target).long()
    return assemble(cfg, 10, x, y)


@DATASETS.register(
    "synthetic", "learnable synthetic images: one random prototype per class plus Gaussian noise"
)
def _load_synthetic(cfg: DataConfig) -> Task:
    syn = cfg.synthetic
    c, h, w = (int(s) for s in syn.shape)
    gen = torch.Generator().manual_seed(cfg.split_seed)
    prototypes = torch.rand(syn.classes, c, h, w, generator=gen)
    y = torch.arange(syn.size) % syn.classes
    noise = torch.randn(syn.size, c, h, w, generator=gen) * SYNTHETIC_NOISE_STD
    x = (prototypes[y] + noise).clamp_(0.0, 1.0)
    return assemble(cfg, syn.classes, x, y)


def token_task(task: Task, vocab: int) -> Task:
    """A task of token ids: identity normalisation (the ids reach the model unchanged) and its vocabulary."""
    return dataclasses.replace(task, mean=(0.0,), std=(1.0,), vocab=vocab)


@DATASETS.register(
    "tokens", "learnable synthetic token sequences: one random prototype sequence per class, tokens redrawn at random"
)
def _load_tokens(cfg: DataConfig) -> Task:
    tok = cfg.tokens
    gen = torch.Generator().manual_seed(cfg.split_seed)
    prototypes = torch.randint(0, tok.vocab, (tok.classes, tok.length), generator=gen)
    y = torch.arange(tok.size) % tok.classes
    redraw = torch.rand(tok.size, tok.length, generator=gen) < tok.noise
    noise = torch.randint(0, tok.vocab, (tok.size, tok.length), generator=gen)
    x = torch.where(redraw, noise, prototypes[y])
    return token_task(assemble(cfg, tok.classes, x.float().view(tok.size, 1, 1, tok.length), y), tok.vocab)


@DATASETS.register(
    "textfile", "a local text file (data.root) as byte tokens: windows of data.tokens.length bytes, the class "
                "is the next byte"
)
def _load_textfile(cfg: DataConfig) -> Task:
    path, t = _abs_root(cfg), cfg.tokens.length
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"data.root: textfile needs a readable file, got {path} ({_one_line(str(err))})") from None
    n = len(data) // (t + 1)
    if n < 2:
        raise ConfigError(f"data.root: {path} has {len(data)} bytes; textfile needs at least 2 windows of "
                          f"data.tokens.length + 1 = {t + 1} bytes")
    windows = torch.frombuffer(bytearray(data[: n * (t + 1)]), dtype=torch.uint8).long().view(n, t + 1)
    x, y = windows[:, :t].float().view(n, 1, 1, t), windows[:, t]
    return token_task(assemble(cfg, 256, x, y), 256)


# --------------------------------------------------------------------------- torchvision datasets


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
        detail = _one_line(f"{type(exc).__name__}: {exc}")
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
                              f"({_one_line(f'{type(exc).__name__}: {exc}')}); replace them") from None
        if x.dim() != 3 or y.dim() != 1 or x.shape[0] != y.shape[0] or (len(y) > 0 and int(y.max()) > 9):
            raise ConfigError(f"data.root: {label} files in {folder} could not be read (images {tuple(x.shape)}, "
                              f"labels {tuple(y.shape)}: expected N x H x W images, N labels 0..9); replace them")
        parts[train] = (x.unsqueeze(1), y.long())  # N x 1 x H x W
    return parts


def _mnist_like(cfg: DataConfig, class_name: str) -> Task:
    """MNIST-family idx files, searched in ``data.root/<ClassName>/raw/`` (plain or .gz) and then in the system
    folders of ``SYSTEM_FOLDERS``; fetched into ``data.root`` by torchvision only with ``data.download``."""
    root = _abs_root(cfg)
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


@DATASETS.register("mnist", "MNIST handwritten digits via torchvision from data.root (1x28x28, 10 classes)")
def _load_mnist(cfg: DataConfig) -> Task:
    return _mnist_like(cfg, "MNIST")


@DATASETS.register(
    "fashionmnist", "Fashion-MNIST clothing images via torchvision from data.root (1x28x28, 10 classes)"
)
def _load_fashionmnist(cfg: DataConfig) -> Task:
    return _mnist_like(cfg, "FashionMNIST")


@DATASETS.register("cifar10", "CIFAR-10 natural images via torchvision from data.root (3x32x32, 10 classes)")
def _load_cifar10(cfg: DataConfig) -> Task:
    import torchvision.datasets as tvd

    root = _abs_root(cfg)
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
    "svhn", "SVHN street-view house numbers via torchvision from data.root (3x32x32, 10 classes)"
)
def _load_svhn(cfg: DataConfig) -> Task:
    import torchvision.datasets as tvd

    root = _abs_root(cfg)
    files = [tvd.SVHN.split_list[s][1] for s in ("train", "test")]
    parts = {}
    for split in ("train", "test"):
        build = functools.partial(tvd.SVHN, str(root), split=split, download=cfg.download)
        ds = _open_torchvision(cfg, "SVHN", root, root, files, build)
        # .data is uint8 N x C x H x W; torchvision already maps the digit-0 label 10 to 0.
        parts[split] = (torch.from_numpy(ds.data), torch.from_numpy(ds.labels).long())
    return assemble(cfg, 10, *parts["train"], *parts["test"])


# --------------------------------------------------------------------------- user image folder


@DATASETS.register(
    "imagefolder", "your own images in data.root/<class>/<image>, RGB, resized to data.image_size"
)
def _load_imagefolder(cfg: DataConfig) -> Task:
    from torchvision import transforms
    from torchvision.datasets import ImageFolder
    from torchvision.datasets.folder import IMG_EXTENSIONS

    root = _abs_root(cfg)
    layout = f"expected {root}/<class name>/<image files>"
    if not root.is_dir():
        raise ConfigError(f"data.root: image folder {root} does not exist or is not a directory ({layout})")

    def visible_image(path: str) -> bool:
        name = os.path.basename(path)
        return not name.startswith(".") and name.lower().endswith(IMG_EXTENSIONS)

    class _VisibleImageFolder(ImageFolder):
        # Skip hidden folders such as .ipynb_checkpoints, which would otherwise become classes.
        def find_classes(self, directory: str | Path) -> tuple[list[str], dict[str, int]]:
            names = sorted(e.name for e in os.scandir(directory) if e.is_dir() and not e.name.startswith("."))
            if not names:
                raise FileNotFoundError(f"no class subfolders in {directory}")
            return names, {n: i for i, n in enumerate(names)}

    size = cfg.image_size
    transform = transforms.Compose(
        [transforms.Resize(size), transforms.CenterCrop(size), transforms.PILToTensor()]
    )
    try:
        ds = _VisibleImageFolder(str(root), transform=transform, is_valid_file=visible_image)
    except FileNotFoundError as exc:
        raise ConfigError(
            f"data.root: no usable images in {root} ({_one_line(str(exc))}); {layout}, extensions "
            f"{', '.join(IMG_EXTENSIONS)}"
        ) from None
    if len(ds.classes) < 2:
        raise ConfigError(
            f"data.root: {root} has {len(ds.classes)} class folder(s), need at least 2 ({layout})"
        )

    images = []
    for i, (path, _) in enumerate(ds.samples):
        try:
            img, _ = ds[i]  # the default loader converts to RGB
        except Exception as exc:  # PIL raises several types for corrupt or unsupported files
            detail = _one_line(f"{type(exc).__name__}: {exc}")
            raise ConfigError(f"data.root: cannot read image {path} ({detail})") from None
        images.append(img)
    x = torch.stack(images)  # uint8 N x 3 x size x size
    y = torch.tensor(ds.targets, dtype=torch.long)
    return assemble(cfg, len(ds.classes), x, y)


__all__ = ["DATASETS", "load_task", "validate_data_config"]

"""Your own images: ``data.root/<class>/<image>``.

``imagefolder`` needs at least 2 class folders, each with at least one image; hidden folders and files (names
starting with ".") are skipped; images are converted to RGB, their shorter side is resized to ``image_size``
(antialiased) and then centre-cropped to ``image_size x image_size``.

The examples are in torchvision ``ImageFolder``'s order (classes sorted by name, each class folder's walk sorted by
folder, then by file name), but the walk follows no link to a folder: one can loop forever (``ln -s .. cat/up``) or
bring a folder's images in twice, under two classes or into both train and test, so such a link is refused. Every
image must be a regular file (a link to one is fine), and no file may appear twice (hard links, links).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import torch

from dpeval.core.datasets._common import abs_root, one_line
from dpeval.core.errors import ConfigError
from dpeval.core.files import open_regular
from dpeval.core.registry import DATASETS
from dpeval.core.settings import DataConfig
from dpeval.core.splits import Task, assemble


def _is_folder(path: str) -> bool:
    """Whether ``path`` is a folder to walk; a link to a folder is refused."""
    if os.path.islink(path) and os.path.isdir(path):
        raise ConfigError(f"data.root: {path} is a link to a folder; imagefolder follows none (a link can loop or "
                          f"bring images in twice): replace it by the folder itself or remove it")
    return os.path.isdir(path)


def image_files(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """The class folders under ``root`` and their images as (path, class index), in ``ImageFolder``'s order; raises
    ConfigError for a link to a folder, an image name on something other than a regular file, or one file
    reached twice."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    classes = sorted(e.name for e in os.scandir(root) if not e.name.startswith(".") and _is_folder(e.path))
    samples: list[tuple[str, int]] = []
    seen: dict[tuple[int, int], str] = {}
    for index, name in enumerate(classes):
        for folder, subfolders, files in sorted(os.walk(os.path.join(root, name))):  # links to folders not entered
            for sub in subfolders:
                _is_folder(os.path.join(folder, sub))
            for file in sorted(files):
                if file.startswith(".") or not file.lower().endswith(IMG_EXTENSIONS):
                    continue
                path = os.path.join(folder, file)
                try:
                    info = os.stat(path)
                except OSError as exc:  # a dangling link, say
                    raise ConfigError(f"data.root: cannot read image {path} ({one_line(str(exc))})") from None
                if not stat.S_ISREG(info.st_mode):
                    raise ConfigError(f"data.root: {path} is not a regular file (a FIFO, device or socket named like "
                                      f"an image); remove it")
                first = seen.setdefault((info.st_dev, info.st_ino), path)
                if first != path:
                    raise ConfigError(f"data.root: {first} and {path} are the same file (a link); each image may "
                                      f"appear once (twice it can land in both train and test): remove one")
                samples.append((path, index))
    return classes, samples


@DATASETS.register(
    "imagefolder", "your own images in data.root/<class>/<image>, RGB, resized to data.image_size",
    default_model="resnet20-gn",
)
def _load_imagefolder(cfg: DataConfig) -> Task:
    from PIL import Image
    from torchvision import transforms
    from torchvision.datasets.folder import IMG_EXTENSIONS

    root = abs_root(cfg)
    layout = f"expected {root}/<class name>/<image files>"
    if not root.is_dir():
        raise ConfigError(f"data.root: image folder {root} does not exist or is not a directory ({layout})")
    classes, samples = image_files(root)
    empty = sorted(set(classes) - {classes[i] for _, i in samples})
    if not classes or empty:
        found = f"no image files in {', '.join(empty)}" if classes else "no class subfolders"
        raise ConfigError(f"data.root: no usable images in {root} ({found}); {layout}, extensions "
                          f"{', '.join(IMG_EXTENSIONS)}")
    if len(classes) < 2:
        raise ConfigError(f"data.root: {root} has {len(classes)} class folder(s), need at least 2 ({layout})")

    size = cfg.image_size
    transform = transforms.Compose(
        [transforms.Resize(size), transforms.CenterCrop(size), transforms.PILToTensor()]
    )
    images = []
    for path, _ in samples:
        try:
            with open_regular(path) as f:
                images.append(transform(Image.open(f).convert("RGB")))
        except Exception as exc:  # PIL raises several types for corrupt or unsupported files
            detail = one_line(f"{type(exc).__name__}: {exc}")
            raise ConfigError(f"data.root: cannot read image {path} ({detail})") from None
    x = torch.stack(images)  # uint8 N x 3 x size x size
    y = torch.tensor([index for _, index in samples], dtype=torch.long)
    return assemble(cfg, len(classes), x, y)

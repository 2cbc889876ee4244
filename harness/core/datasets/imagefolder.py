"""Your own images: ``data.root/<class>/<image>``.

``imagefolder`` needs at least 2 class folders, each with at least one image; hidden folders and files (names
starting with ".") are skipped; images are converted to RGB, their shorter side is resized to ``image_size``
(antialiased) and then centre-cropped to ``image_size x image_size``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from dpeval.core.datasets._common import abs_root, one_line
from dpeval.core.errors import ConfigError
from dpeval.core.registry import DATASETS
from dpeval.core.settings import DataConfig
from dpeval.core.splits import Task, assemble


@DATASETS.register(
    "imagefolder", "your own images in data.root/<class>/<image>, RGB, resized to data.image_size",
    default_model="resnet20-gn",
)
def _load_imagefolder(cfg: DataConfig) -> Task:
    from torchvision import transforms
    from torchvision.datasets import ImageFolder
    from torchvision.datasets.folder import IMG_EXTENSIONS

    root = abs_root(cfg)
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
            f"data.root: no usable images in {root} ({one_line(str(exc))}); {layout}, extensions "
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
            detail = one_line(f"{type(exc).__name__}: {exc}")
            raise ConfigError(f"data.root: cannot read image {path} ({detail})") from None
        images.append(img)
    x = torch.stack(images)  # uint8 N x 3 x size x size
    y = torch.tensor(ds.targets, dtype=torch.long)
    return assemble(cfg, len(ds.classes), x, y)

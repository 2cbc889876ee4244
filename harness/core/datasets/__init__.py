"""Dataset loaders, registered by name, one module per family: ``embedded`` (the bundled digits and synthetic
images), ``tokens`` (synthetic token sequences and a local text file), ``torchvision_sets`` (MNIST, Fashion-MNIST,
CIFAR-10, SVHN read from ``data.root``) and ``imagefolder`` (the user's own images). A loader is a function
``DataConfig -> Task`` decorated with ``@DATASETS.register("name", "description", default_model="model")`` (the
model a run builds when ``model.name`` is not given); it splits its examples with
``dpeval.core.splits.assemble`` (see that module for the roles and the split rules).
Adding a dataset is one new module here (docs/architecture.md, "How to add a dataset").

Other choices
-------------
* ``data.synthetic.*`` is validated only when ``data.name == "synthetic"``; all other fields are
  validated for every dataset, even where unused (``image_size``; and ``test_fraction +
  public_fraction < 1`` holds for official-test datasets too, where ``test_fraction`` is ignored).
* ``data.split_seed`` must be an integer in ``[0, 2**63)``.
* ``Split`` and ``Task`` compare by identity (``eq=False``): field-wise ``==`` on tensors is
  ambiguous, so the generated ``__eq__`` would raise.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

from dpeval.core.errors import ConfigError, brief
from dpeval.core.registry import DATASETS
from dpeval.core.settings import DataConfig
from dpeval.core.splits import Task, with_public

MIN_IMAGE_SIZE = 4
# The longest path and file name (bytes) Linux opens (PATH_MAX, NAME_MAX): a longer data.root can only fail mid-load.
MAX_PATH_BYTES, MAX_NAME_BYTES = 4095, 255

Loader = Callable[[DataConfig], Task]  # what a registered dataset is


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
    path = os.fsencode(os.path.abspath(os.path.expanduser(cfg.root)))
    if len(path) > MAX_PATH_BYTES or any(len(name) > MAX_NAME_BYTES for name in path.split(b"/")):
        raise ConfigError(f"data.root: must be a path of at most {MAX_PATH_BYTES} bytes, names of at most "
                          f"{MAX_NAME_BYTES}, got {brief(str(cfg.root))}")
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
    for field in ("max_train", "max_test"):
        if not _is_int(getattr(cfg, field)) or getattr(cfg, field) < 0:
            raise ConfigError(f"data.{field}: must be an integer >= 0 (0 = no cap), got {brief(getattr(cfg, field))}")
    if not _is_int(cfg.image_size) or cfg.image_size < MIN_IMAGE_SIZE:
        raise ConfigError(f"data.image_size: must be an integer >= {MIN_IMAGE_SIZE}, got {brief(cfg.image_size)}")
    if cfg.public_source is not None:
        if not isinstance(cfg.public_source, str):
            raise ConfigError(f"data.public_source: must be a dataset name or null, got {brief(cfg.public_source)}")
        DATASETS.get(cfg.public_source, field="data.public_source")
        if cfg.public_source == cfg.name:
            raise ConfigError(f"data.public_source: names the dataset itself ({cfg.name!r}); leave it null for a "
                              f"share of its own training source")
        if not cfg.public_fraction > 0:
            raise ConfigError("data.public_fraction: must be > 0 with data.public_source (the share of that "
                              "dataset's training source that forms the public split)")
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
    """Validate ``cfg`` and load the dataset it names, split into train / test / public; with
    ``data.public_source`` the public split is that dataset's public share, converted (``with_public``)."""
    validate_data_config(cfg)
    if cfg.public_source is None:
        return DATASETS.get(cfg.name, field="data.name")(cfg)
    task = DATASETS.get(cfg.name, field="data.name")(dataclasses.replace(cfg, public_fraction=0.0, public_source=None))
    # The other dataset's own split gives its public share (a random subset, the only rows turned into floats);
    # its private pool is capped at one example, never used.
    source = DATASETS.get(cfg.public_source, field="data.public_source")(
        dataclasses.replace(cfg, name=cfg.public_source, public_source=None, max_train=1))
    if source.vocab is not None or task.vocab is not None:
        raise ConfigError("data.public_source: only image datasets can stand in as another one's public data")
    return with_public(task, source.public, cfg)


__all__ = ["DATASETS", "Loader", "load_task", "validate_data_config"]

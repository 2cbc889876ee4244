"""The three roles of a privacy evaluation and how a dataset source is split into them.

Every dataset becomes a :class:`Task` with three disjoint :class:`Split` s:

* ``train``  - the private training pool (the records differential privacy protects);
* ``test``   - held-out evaluation data;
* ``public`` - a public / auxiliary set (GEP anchor gradients, membership-inference populations).

Images are float32 ``N x C x H x W`` in ``[0, 1]`` and deliberately *not* normalised: models carry
their own Normalize layer, built from ``Task.mean`` / ``Task.std``: per-channel statistics of the
*public* split (never of the private pool, whose statistics would be an unaccounted release); 0.5 / 0.25
when there is no public split. std uses the population formula and is floored at 1e-3 so constant
channels cannot blow up the division.

Splitting (deterministic)
-------------------------
A ``torch.Generator`` seeded with ``data.split_seed`` - independent of the run/training seed, so the
population of members and non-members stays fixed across training seeds - draws one permutation of
the training source (and then one of the official test source, if there is one):

* Datasets without an official test split (digits, synthetic, imagefolder) have a single source of
  N examples. With ``perm`` its permutation: ``test = perm[:n_test]``,
  ``public = perm[n_test:n_test + n_public]``, the rest is the private pool, where
  ``n_test = round(test_fraction * N)`` and ``n_public = round(public_fraction * N)``. Both
  fractions are of the whole source N (hence the rule ``test_fraction + public_fraction < 1``).
* Datasets with an official test split (mnist, fashionmnist, cifar10, svhn) use it as ``test``
  (``data.test_fraction`` is then ignored) and carve ``public = perm[:round(public_fraction * N)]``
  from the training source; the rest is the private pool. ``test.source_index`` is the index
  *within the official test source*, whereas ``train`` / ``public`` index the training source, so
  indices are comparable only within one source.
* ``data.max_train > 0`` keeps the first ``max_train`` examples of the private pool (no error if
  the pool is smaller). Test and public do not depend on ``max_train``, and a smaller cap yields a
  prefix of a larger one, so the roles are nested across caps.
* ``data.max_test > 0`` keeps the first ``max_test`` examples of the test split, likewise (public and the
  private pool do not depend on it).
* Python's ``round`` is used (half to even: ``round(2.5) == 2``).
* Each role keeps the permuted order (the official test split is permuted too), so any prefix of a
  role is a uniform random subsample of it.

Indices
-------
``source_index`` is the row in the source: the ``load_digits`` order, the generation order for
synthetic, the torchvision ``.data`` order, and for ``imagefolder`` the order of
``ImageFolder.samples`` (class folders sorted by name, then file paths sorted).

"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from dpeval.core.errors import ConfigError
from dpeval.core.settings import DataConfig

STD_FLOOR = 1e-3
NO_PUBLIC_MEAN, NO_PUBLIC_STD = 0.5, 0.25  # normalisation when there is no public split


@dataclass(frozen=True, eq=False)
class Split:
    """One role's examples: images, labels, and where each example came from."""

    x: torch.Tensor  # float32, N x C x H x W, pixel values in [0, 1] (not normalised)
    y: torch.Tensor  # int64, N
    source_index: torch.Tensor  # int64, N: row of each example in its source (provenance / MIA)

    def __post_init__(self) -> None:
        n = self.x.shape[0]
        if self.y.shape != (n,) or self.source_index.shape != (n,):
            raise ValueError(
                f"Split: x has {n} rows but y has shape {tuple(self.y.shape)} and source_index "
                f"{tuple(self.source_index.shape)}"
            )

    def __len__(self) -> int:
        return int(self.x.shape[0])


@dataclass(frozen=True, eq=False)
class Task:
    """A dataset split into private train pool, test and public roles, plus input statistics."""

    dataset: str
    train: Split  # the private training pool (what DP protects)
    test: Split  # held-out evaluation set
    public: Split  # public / auxiliary set, disjoint from train and test
    num_classes: int
    shape: tuple[int, int, int]  # C, H, W
    mean: tuple[float, ...]  # per-channel mean of public.x (0.5 without a public split)
    std: tuple[float, ...]  # per-channel std of public.x, floored at STD_FLOOR
    vocab: int | None = None  # token datasets: x holds token ids in [0, vocab) (as floats); None for images


def _to_unit_float(x: torch.Tensor) -> torch.Tensor:
    # Sources stay uint8 until split so that only the selected rows are expanded to float32.
    if x.dtype == torch.uint8:
        x = x.float().div_(255.0)
    else:
        x = x.float()
    # Sources are often permuted views (HWC -> CHW); give consumers a plain contiguous tensor.
    return x.contiguous()


def _take(x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor) -> Split:
    return Split(x=_to_unit_float(x[idx]), y=y[idx].long().contiguous(), source_index=idx.long().clone())


def _channel_stats(x: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    flat = x.transpose(0, 1).reshape(x.shape[1], -1).double()
    mean = flat.mean(dim=1)
    std = flat.std(dim=1, correction=0).clamp_min(STD_FLOOR)
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


def assemble(
    cfg: DataConfig,
    num_classes: int,
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    test_x: torch.Tensor | None = None,
    test_y: torch.Tensor | None = None,
) -> Task:
    """Split the source(s) into the three roles (see the module docstring) and build the Task."""
    if test_x is not None and test_x.shape[1:] != train_x.shape[1:]:  # one model cannot take both
        raise ConfigError(f"data.name: {cfg.name} has training images {tuple(train_x.shape[1:])}, test images "
                          f"{tuple(test_x.shape[1:])}; both must have one shape")
    gen = torch.Generator().manual_seed(cfg.split_seed)
    n = int(train_x.shape[0])
    perm = torch.randperm(n, generator=gen)
    n_public = round(cfg.public_fraction * n)
    if test_x is None:
        n_test = round(cfg.test_fraction * n)
        test_idx = perm[:n_test]
        public_idx = perm[n_test : n_test + n_public]
        pool = perm[n_test + n_public :]
        test = _take(train_x, train_y, test_idx[: cfg.max_test or None])
    else:
        assert test_y is not None
        n_test = int(test_x.shape[0])
        public_idx = perm[:n_public]
        pool = perm[n_public:]
        test = _take(test_x, test_y, torch.randperm(n_test, generator=gen)[: cfg.max_test or None])
    if len(pool) == 0:
        held_out = f"{n_public} public" + (f", {n_test} test" if test_x is None else "")
        knobs = "data.public_fraction" + (" / data.test_fraction" if test_x is None else "")
        raise ConfigError(
            f"data.public_fraction: leaves no examples for the private training pool of {cfg.name!r} "
            f"({n} training-source examples, {held_out}); lower {knobs} or use a larger dataset"
        )
    if cfg.max_train > 0:
        pool = pool[: cfg.max_train]
    train = _take(train_x, train_y, pool)
    public = _take(train_x, train_y, public_idx)
    c, h, w = (int(s) for s in train.x.shape[1:])
    # Normalisation statistics are public information: they come from the public split, never from the
    # private pool (that would be a data-dependent release outside the accountant); with no public split,
    # a fixed 0.5 / 0.25 per channel; ``normalize: none`` feeds the pixels unchanged.
    if cfg.normalize == "none":
        mean, std = (0.0,) * c, (1.0,) * c
    elif len(public):
        mean, std = _channel_stats(public.x)
    else:
        mean, std = (NO_PUBLIC_MEAN,) * c, (NO_PUBLIC_STD,) * c
    return Task(
        dataset=cfg.name,
        train=train,
        test=test,
        public=public,
        num_classes=num_classes,
        shape=(c, h, w),
        mean=mean,
        std=std,
    )


LUMA = (0.299, 0.587, 0.114)  # ITU-R BT.601: RGB -> grey, as PIL's convert("L")


def converted(x: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
    """Images in [0, 1] (N × C' × H' × W') as ``shape``'s channels and size: RGB to grey by luma, grey to RGB by
    repetition, then a bilinear, antialiased resize."""
    import torch.nn.functional as F

    channels, height, width = shape
    if x.shape[1] != channels:
        if x.shape[1] == 3 and channels == 1:
            x = torch.einsum("nchw,c->nhw", x, torch.tensor(LUMA, dtype=x.dtype)).unsqueeze(1)
        elif x.shape[1] == 1:
            x = x.expand(-1, channels, -1, -1)
        else:
            raise ConfigError(f"data.public_source: cannot turn {x.shape[1]}-channel images into {channels}-channel "
                              "ones")
    if tuple(x.shape[2:]) != (height, width):
        x = F.interpolate(x, size=(height, width), mode="bilinear", antialias=True, align_corners=False)
    return x.clamp(0.0, 1.0).contiguous()


def with_public(task: Task, public: Split, cfg: DataConfig) -> Task:
    """``task`` with ``public`` (another dataset's images, its labels and provenance) as its public split, converted
    to the task's channels and size; the normalisation statistics follow the new public split."""
    split = Split(converted(public.x, task.shape), public.y, public.source_index)
    if cfg.normalize == "none" or len(split) == 0:
        mean, std = task.mean, task.std
    else:
        mean, std = _channel_stats(split.x)
    return dataclasses.replace(task, public=split, mean=mean, std=std)

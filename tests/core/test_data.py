"""Tests for harness.data: role splits, the embedded datasets, torchvision loaders on tiny fake
files written in their real on-disk formats, the image-folder loader, and config validation."""

from __future__ import annotations

import dataclasses
import importlib
import math
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
import torch

from dpeval.core.datasets import load_task, torchvision_sets
from dpeval.core.datasets.torchvision_sets import read_idx
from dpeval.core.errors import ConfigError, RunFailure
from dpeval.core.registry import DATASETS
from dpeval.core.settings import DataConfig, SyntheticConfig
from dpeval.core.splits import Split, Task
from tests.torchvision_files import make_cifar10, make_mnist_like, make_svhn, skip_md5, write_idx


@pytest.fixture(autouse=True)
def no_system_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests write their own files: a system copy (Debian's Fashion-MNIST) must not stand in for them."""
    monkeypatch.setattr(torchvision_sets, "SYSTEM_FOLDERS", {})


def cfg_with(**overrides) -> DataConfig:
    return dataclasses.replace(DataConfig(), **overrides)


def assert_roles_disjoint(task: Task, same_source_test: bool) -> None:
    train = set(task.train.source_index.tolist())
    public = set(task.public.source_index.tolist())
    test = set(task.test.source_index.tolist())
    # No duplicates inside a role either.
    assert len(train) == len(task.train) and len(public) == len(task.public) and len(test) == len(task.test)
    assert not train & public
    if same_source_test:
        assert not train & test and not public & test


def assert_split_dtypes(split: Split, shape: tuple[int, int, int]) -> None:
    assert split.x.dtype == torch.float32
    assert split.y.dtype == torch.int64
    assert split.source_index.dtype == torch.int64
    assert tuple(split.x.shape[1:]) == shape
    if len(split):
        assert float(split.x.min()) >= 0.0 and float(split.x.max()) <= 1.0


# --------------------------------------------------------------------------- digits


@pytest.fixture(scope="module")
def digits() -> Task:
    return load_task(DataConfig())


def test_registry_names() -> None:
    expected = ["cifar10", "digits", "fashionmnist", "imagefolder", "mnist", "svhn", "synthetic", "textfile", "tokens"]
    assert DATASETS.names() == expected
    assert all(DATASETS.describe()[name] for name in expected)


def test_digits_shapes_roles_and_provenance(digits: Task) -> None:
    from sklearn.datasets import load_digits

    assert digits.dataset == "digits"
    assert digits.num_classes == 10
    assert digits.shape == (1, 8, 8)
    for split in (digits.train, digits.test, digits.public):
        assert_split_dtypes(split, (1, 8, 8))
    # Defaults: test round(0.2*1797)=359, public round(0.1*1797)=180, the rest is the private pool.
    assert (len(digits.train), len(digits.test), len(digits.public)) == (1258, 359, 180)
    assert_roles_disjoint(digits, same_source_test=True)
    everything = torch.cat([digits.train.source_index, digits.test.source_index, digits.public.source_index])
    assert torch.equal(everything.sort().values, torch.arange(1797))
    assert float(digits.train.x.max()) == 1.0  # digit pixels reach 16/16
    assert set(digits.train.y.tolist()) == set(range(10))
    # Each example is the source row its source_index claims.
    bunch = load_digits()
    src = digits.test.source_index
    expected = torch.from_numpy(bunch.images[src.numpy()]).float().div(16).unsqueeze(1)
    assert torch.allclose(digits.test.x, expected)
    assert torch.equal(digits.test.y, torch.from_numpy(bunch.target[src.numpy()]).long())


def test_normalisation_comes_from_public_data_only(digits: Task) -> None:
    x = digits.public.x.double()
    assert digits.mean == pytest.approx((float(x.mean()),), rel=1e-6)
    assert digits.std == pytest.approx((float(x.std(correction=0)),), rel=1e-6)
    private = digits.train.x.double()
    assert digits.mean != pytest.approx((float(private.mean()),), rel=1e-6)
    # Changing the private pool (a cap) must not change what the model is told.
    assert load_task(cfg_with(max_train=100)).mean == digits.mean
    none_public = load_task(cfg_with(public_fraction=0.0))
    assert none_public.mean == (0.5,) and none_public.std == (0.25,)


def test_split_seed_determinism(digits: Task) -> None:
    again = load_task(DataConfig())
    other = load_task(cfg_with(split_seed=1))
    for role in ("train", "test", "public"):
        assert torch.equal(getattr(digits, role).source_index, getattr(again, role).source_index)
        assert torch.equal(getattr(digits, role).x, getattr(again, role).x)
        assert not torch.equal(getattr(digits, role).source_index, getattr(other, role).source_index)


def test_max_train_caps_pool_without_moving_other_roles(digits: Task) -> None:
    capped = load_task(cfg_with(max_train=100))
    assert len(capped.train) == 100
    # The capped pool is a prefix of the uncapped one; test and public are unchanged.
    assert torch.equal(capped.train.source_index, digits.train.source_index[:100])
    assert torch.equal(capped.test.source_index, digits.test.source_index)
    assert torch.equal(capped.public.source_index, digits.public.source_index)
    # A cap larger than the pool is simply the whole pool.
    assert len(load_task(cfg_with(max_train=10_000)).train) == 1258


def test_max_test_caps_the_test_split_without_moving_other_roles(digits: Task) -> None:
    capped = load_task(cfg_with(max_test=50))
    assert torch.equal(capped.test.source_index, digits.test.source_index[:50])  # a prefix of the shuffled split
    assert torch.equal(capped.train.source_index, digits.train.source_index)
    assert torch.equal(capped.public.source_index, digits.public.source_index)
    assert len(load_task(cfg_with(max_test=10_000)).test) == len(digits.test)


def test_zero_fractions_give_empty_roles_with_right_shape() -> None:
    task = load_task(cfg_with(test_fraction=0.0, public_fraction=0.0))
    assert len(task.train) == 1797 and len(task.test) == 0 and len(task.public) == 0
    assert tuple(task.test.x.shape) == (0, 1, 8, 8)


def test_split_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError):
        Split(x=torch.zeros(3, 1, 2, 2), y=torch.zeros(2, dtype=torch.long), source_index=torch.arange(3))


# --------------------------------------------------------------------------- synthetic


def test_synthetic_honours_config() -> None:
    cfg = cfg_with(name="synthetic", synthetic=SyntheticConfig(shape=[3, 5, 7], classes=4, size=200))
    task = load_task(cfg)
    assert task.shape == (3, 5, 7) and task.num_classes == 4
    assert len(task.train) + len(task.test) + len(task.public) == 200
    assert (len(task.test), len(task.public)) == (40, 20)
    for split in (task.train, task.test, task.public):
        assert_split_dtypes(split, (3, 5, 7))
    assert_roles_disjoint(task, same_source_test=True)
    all_y = torch.cat([task.train.y, task.test.y, task.public.y])
    assert torch.bincount(all_y, minlength=4).tolist() == [50, 50, 50, 50]
    train_counts = torch.bincount(task.train.y, minlength=4)
    assert int(train_counts.min()) >= 0.5 * len(task.train) / 4  # roughly balanced after the split
    assert len(task.mean) == 3 and len(task.std) == 3


def test_synthetic_depends_on_split_seed() -> None:
    a = load_task(cfg_with(name="synthetic"))
    b = load_task(cfg_with(name="synthetic"))
    c = load_task(cfg_with(name="synthetic", split_seed=5))
    assert torch.equal(a.train.x, b.train.x)
    assert not torch.equal(a.train.x, c.train.x)


def test_synthetic_is_learnable() -> None:
    task = load_task(cfg_with(name="synthetic"))
    # Nearest class-mean classifier fitted on train, scored on test.
    flat_train = task.train.x.flatten(1)
    means = torch.stack([flat_train[task.train.y == k].mean(0) for k in range(task.num_classes)])
    pred = torch.cdist(task.test.x.flatten(1), means).argmin(1)
    accuracy = float((pred == task.test.y).float().mean())
    assert accuracy > 0.8


# --------------------------------------------------------------------------- torchvision fakes


def check_official_split(task: Task, n_train: int, n_test: int, public_fraction: float) -> None:
    n_public = round(public_fraction * n_train)
    assert len(task.public) == n_public
    assert len(task.train) == n_train - n_public
    # The whole official test split, nothing carved from train (test_fraction is ignored).
    assert len(task.test) == n_test
    assert torch.equal(task.test.source_index.sort().values, torch.arange(n_test))
    assert_roles_disjoint(task, same_source_test=False)
    covered = torch.cat([task.train.source_index, task.public.source_index]).sort().values
    assert torch.equal(covered, torch.arange(n_train))


@pytest.mark.parametrize("name,folder", [("mnist", "MNIST"), ("fashionmnist", "FashionMNIST")])
def test_mnist_like_from_idx_files(tmp_path: Path, name: str, folder: str) -> None:
    arrays = make_mnist_like(tmp_path, folder, n_train=40, n_test=15)
    task = load_task(cfg_with(name=name, root=str(tmp_path), test_fraction=0.5, public_fraction=0.1))
    assert task.shape == (1, 28, 28) and task.num_classes == 10
    for split in (task.train, task.test, task.public):
        assert_split_dtypes(split, (1, 28, 28))
    check_official_split(task, 40, 15, 0.1)
    for split, prefix in ((task.train, "train"), (task.test, "test")):
        src = split.source_index.numpy()
        expected_x = torch.from_numpy(arrays[f"{prefix}_x"][src]).float().div(255).unsqueeze(1)
        assert torch.equal(split.x, expected_x)
        assert split.y.tolist() == arrays[f"{prefix}_y"][src].tolist()


def gzip_folder(folder: Path) -> None:
    """Compress every idx file of ``folder`` in place, as Zalando and Debian ship them."""
    import gzip

    for path in list(folder.iterdir()):
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()


def test_mnist_like_reads_gzip_idx_files_as_shipped(tmp_path: Path) -> None:
    arrays = make_mnist_like(tmp_path, "FashionMNIST", n_train=30, n_test=10)
    gzip_folder(tmp_path / "FashionMNIST" / "raw")
    task = load_task(cfg_with(name="fashionmnist", root=str(tmp_path), public_fraction=0.0))
    src = task.train.source_index.numpy()
    assert torch.equal(task.train.x, torch.from_numpy(arrays["train_x"][src]).float().div(255).unsqueeze(1))
    assert task.test.y.tolist() == arrays["test_y"][task.test.source_index.numpy()].tolist()


def test_system_folder_is_searched_after_data_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    system = tmp_path / "system"
    arrays = make_mnist_like(system, "FashionMNIST", n_train=30, n_test=10)
    shipped = system / "FashionMNIST" / "raw"
    gzip_folder(shipped)
    monkeypatch.setattr(torchvision_sets, "SYSTEM_FOLDERS", {"FashionMNIST": (tmp_path / "absent", shipped)})
    # Nothing under data.root: the system copy is read where it lies (no copy into data.root).
    empty_root = tmp_path / "data"
    task = load_task(cfg_with(name="fashionmnist", root=str(empty_root), public_fraction=0.0))
    assert len(task.train) == 30 and len(task.test) == 10 and not empty_root.exists()
    src = task.train.source_index.numpy()
    assert task.train.y.tolist() == arrays["train_y"][src].tolist()
    # A complete copy under data.root wins over the system one.
    own = make_mnist_like(tmp_path / "own", "FashionMNIST", n_train=20, n_test=5)
    task = load_task(cfg_with(name="fashionmnist", root=str(tmp_path / "own"), public_fraction=0.0))
    assert len(task.train) == 20
    assert torch.equal(task.test.x, torch.from_numpy(own["test_x"][task.test.source_index.numpy()]).float()
                       .div(255).unsqueeze(1))


def test_incomplete_data_root_is_refused_not_silently_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    system = tmp_path / "system"
    make_mnist_like(system, "FashionMNIST", n_train=30, n_test=10)
    monkeypatch.setattr(torchvision_sets, "SYSTEM_FOLDERS", {"FashionMNIST": (system / "FashionMNIST" / "raw",)})
    own = tmp_path / "own"
    make_mnist_like(own, "FashionMNIST", n_train=20, n_test=5)
    (own / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(ConfigError, match="lacks t10k-labels-idx1-ubyte"):
        load_task(cfg_with(name="fashionmnist", root=str(own)))


def test_fashionmnist_nowhere_names_the_debian_package_and_download(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torchvision_sets, "SYSTEM_FOLDERS", {"FashionMNIST": (tmp_path / "usr-share",)})
    with pytest.raises(ConfigError) as info:
        load_task(cfg_with(name="fashionmnist", root=str(tmp_path / "data")))
    message = str(info.value)
    assert "apt-get install dataset-fashion-mnist" in message and "data.download=true" in message
    assert str(tmp_path / "usr-share") in message and "\n" not in message


@pytest.mark.parametrize("damage", ["type", "short", "long"])
def test_read_idx_rejects_what_is_not_a_byte_idx_file(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "f-idx3-ubyte"
    write_idx(path, np.zeros((3, 4, 5), dtype=np.uint8))
    raw = bytearray(path.read_bytes())
    if damage == "type":
        raw[2] = 0x0D  # float32
    elif damage == "short":
        raw = raw[:-1]
    else:
        raw += b"\x00"
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError):
        read_idx(path)


def test_cifar10_from_pickled_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    skip_md5(monkeypatch, "cifar")
    batches = make_cifar10(tmp_path, per_batch=6, n_test=8)

    task = load_task(cfg_with(name="cifar10", root=str(tmp_path), public_fraction=0.2))
    assert task.shape == (3, 32, 32) and task.num_classes == 10 and len(task.mean) == 3
    for split in (task.train, task.test, task.public):
        assert_split_dtypes(split, (3, 32, 32))
        assert split.x.is_contiguous()
    check_official_split(task, 30, 8, 0.2)
    train_x = np.concatenate([batches[f"data_batch_{i}"][0] for i in range(1, 6)]).reshape(-1, 3, 32, 32)
    train_y = sum((batches[f"data_batch_{i}"][1] for i in range(1, 6)), [])
    src = task.train.source_index.numpy()
    assert torch.equal(task.train.x, torch.from_numpy(train_x[src]).float().div(255))
    assert task.train.y.tolist() == [train_y[i] for i in src]
    test_x = batches["test_batch"][0].reshape(-1, 3, 32, 32)
    src = task.test.source_index.numpy()
    assert torch.equal(task.test.x, torch.from_numpy(test_x[src]).float().div(255))


def test_svhn_from_mat_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    skip_md5(monkeypatch, "svhn")
    raw = make_svhn(tmp_path, n_train=20, n_test=7)

    task = load_task(cfg_with(name="svhn", root=str(tmp_path)))
    assert task.shape == (3, 32, 32) and task.num_classes == 10
    for split in (task.train, task.test, task.public):
        assert_split_dtypes(split, (3, 32, 32))
    check_official_split(task, 20, 7, 0.1)
    for split, name in ((task.train, "train"), (task.test, "test")):
        x, y = raw[name]
        src = split.source_index.numpy()
        expected = torch.from_numpy(x[..., src].transpose(3, 2, 0, 1).copy()).float().div(255)
        assert torch.equal(split.x, expected)
        assert split.y.tolist() == [0 if v == 10 else int(v) for v in y[src]]
    all_y = torch.cat([task.train.y, task.public.y])
    assert int(all_y.max()) == 9 and int(all_y.min()) == 0  # 10 was mapped to 0


TORCHVISION_CASES = [
    ("mnist", "MNIST/raw", "mnist", "download_and_extract_archive"),
    ("fashionmnist", "FashionMNIST/raw", "mnist", "download_and_extract_archive"),
    ("cifar10", "cifar-10-batches-py", "cifar", "download_and_extract_archive"),
    ("svhn", "", "svhn", "download_url"),
]


@pytest.mark.parametrize("name,subdir,module,download_fn", TORCHVISION_CASES)
def test_missing_torchvision_data_is_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, subdir: str, module: str, download_fn: str
) -> None:
    calls = []
    monkeypatch.setattr(importlib.import_module(f"torchvision.datasets.{module}"), download_fn, calls.append)
    root = tmp_path / "data"
    with pytest.raises(ConfigError) as info:
        load_task(cfg_with(name=name, root=str(root)))
    message = str(info.value)
    assert message.startswith("data.root:")
    assert str(root / subdir) in message
    assert "data.download" in message
    assert "\n" not in message
    assert calls == []  # no download was attempted


@pytest.mark.parametrize("name,subdir,module,download_fn", TORCHVISION_CASES)
def test_failed_download_is_run_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, subdir: str, module: str, download_fn: str
) -> None:
    def offline(*args, **kwargs):
        raise URLError("no network in tests")

    monkeypatch.setattr(importlib.import_module(f"torchvision.datasets.{module}"), download_fn, offline)
    with pytest.raises(RunFailure, match="data.download") as info:
        load_task(cfg_with(name=name, root=str(tmp_path), download=True))
    assert "\n" not in str(info.value)


def test_partially_missing_torchvision_data_names_missing_files(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    (folder / "batches.meta").write_bytes(b"")
    with pytest.raises(ConfigError) as info:
        load_task(cfg_with(name="cifar10", root=str(tmp_path)))
    message = str(info.value)
    assert f"{folder} lacks data_batch_1" in message and "batches.meta" not in message.split("lacks")[1]


def test_empty_private_pool_with_official_test_split(tmp_path: Path) -> None:
    make_mnist_like(tmp_path, "MNIST", n_train=1, n_test=3)
    # 1 training example, public round(0.9)=1 -> nothing left for the private pool.
    with pytest.raises(ConfigError, match=r"^data.public_fraction: leaves no examples .*1 public\)"):
        load_task(cfg_with(name="mnist", root=str(tmp_path), test_fraction=0.0, public_fraction=0.9))


def test_unreadable_torchvision_files_are_config_error(tmp_path: Path) -> None:
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for split in ("train", "t10k"):
        for f in (f"{split}-images-idx3-ubyte", f"{split}-labels-idx1-ubyte"):
            (raw / f).write_bytes(b"\x00\x00\x0d\x03garbage")  # float32 type code: torchvision rejects it
    with pytest.raises(ConfigError, match="data.root: MNIST files in .* could not be read"):
        load_task(cfg_with(name="mnist", root=str(tmp_path)))


# --------------------------------------------------------------------------- imagefolder


def save_image(path: Path, mode: str, size: tuple[int, int], color) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color).save(path)


def test_imagefolder_loads_resizes_and_splits(tmp_path: Path) -> None:
    root = tmp_path / "imgs"
    # cat: red RGB, dog: green RGBA, emu: grey L (converted to RGB); sizes vary (width, height).
    for i, size in enumerate([(12, 20), (30, 9), (8, 8)]):
        save_image(root / "cat" / f"{i}.png", "RGB", size, (255, 0, 0))
    for i, size in enumerate([(6, 6), (40, 25), (10, 31), (7, 13), (64, 64)]):
        save_image(root / "dog" / f"{i}.png", "RGBA", size, (0, 255, 0, 255))
    for i, size in enumerate([(15, 15), (9, 21)]):
        save_image(root / "emu" / f"{i}.png", "L", size, 128)
    save_image(root / ".ipynb_checkpoints" / "x.png", "RGB", (8, 8), (0, 0, 255))  # hidden: not a class
    (root / "cat" / "notes.txt").write_text("not an image")

    task = load_task(cfg_with(name="imagefolder", root=str(root), image_size=6))
    assert task.num_classes == 3 and task.shape == (3, 6, 6)
    for split in (task.train, task.test, task.public):
        assert_split_dtypes(split, (3, 6, 6))
    # 10 images: test round(2.0)=2, public round(1.0)=1, train 7.
    assert (len(task.train), len(task.test), len(task.public)) == (7, 2, 1)
    assert_roles_disjoint(task, same_source_test=True)
    everything = torch.cat([task.train.source_index, task.test.source_index, task.public.source_index])
    assert torch.equal(everything.sort().values, torch.arange(10))
    # Classes in sorted folder order; samples ordered by class, so source_index determines the label.
    ys = torch.cat([task.train.y, task.test.y, task.public.y])[everything.argsort()]
    assert ys.tolist() == [0] * 3 + [1] * 5 + [2] * 2
    colours = {0: (1.0, 0.0, 0.0), 1: (0.0, 1.0, 0.0), 2: (128 / 255,) * 3}
    for split in (task.train, task.test, task.public):
        for x, y in zip(split.x, split.y):
            expected = torch.tensor(colours[int(y)]).view(3, 1, 1).expand(3, 6, 6)
            assert torch.allclose(x, expected, atol=1e-6)


def test_imagefolder_resizes_shorter_side_then_center_crops(tmp_path: Path) -> None:
    from PIL import Image

    root = tmp_path / "imgs"
    (root / "a").mkdir(parents=True)
    # 12 wide x 24 tall: top 3 rows red, rest blue. Shorter side -> 6 gives 6x12; the centre 6x6
    # crop (rows 3..8, i.e. source rows 6..17) is all blue. Squashing straight to 6x6 would keep a
    # mostly red first row.
    img = Image.new("RGB", (12, 24), (0, 0, 255))
    img.paste((255, 0, 0), (0, 0, 12, 3))
    img.save(root / "a" / "tall.png")
    save_image(root / "b" / "plain.png", "RGB", (5, 5), (0, 0, 0))
    cfg = cfg_with(name="imagefolder", root=str(root), image_size=6, test_fraction=0, public_fraction=0)
    task = load_task(cfg)
    tall = task.train.x[task.train.y == 0][0]
    assert tall.shape == (3, 6, 6)
    assert float(tall[0].max()) < 0.05 and float(tall[2].min()) > 0.95


@pytest.mark.parametrize(
    "setup", ["missing", "no_class_folders", "empty_class_folders", "one_class", "corrupt"]
)
def test_imagefolder_bad_folder_is_config_error(tmp_path: Path, setup: str) -> None:
    root = tmp_path / "imgs"
    if setup != "missing":
        root.mkdir()
    if setup == "no_class_folders":
        (root / "loose.txt").write_text("x")
    if setup == "empty_class_folders":
        (root / "a").mkdir()
        (root / "b").mkdir()
    if setup == "one_class":
        save_image(root / "a" / "0.png", "RGB", (5, 5), (1, 2, 3))
    if setup == "corrupt":
        save_image(root / "a" / "0.png", "RGB", (5, 5), (1, 2, 3))
        (root / "b").mkdir()
        (root / "b" / "bad.png").write_bytes(b"this is not a png")
    with pytest.raises(ConfigError) as info:
        load_task(cfg_with(name="imagefolder", root=str(root)))
    message = str(info.value)
    assert message.startswith("data.root:") and str(root) in message and "\n" not in message
    if setup == "corrupt":
        assert "bad.png" in message


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"name": "nope"}, "data.name"),
        ({"test_fraction": 1.5}, "data.test_fraction"),
        ({"test_fraction": 1.0}, "data.test_fraction"),
        ({"test_fraction": -0.1}, "data.test_fraction"),
        ({"test_fraction": math.nan}, "data.test_fraction"),
        ({"test_fraction": "0.2"}, "data.test_fraction"),
        ({"public_fraction": 1.0}, "data.public_fraction"),
        ({"public_fraction": -0.5}, "data.public_fraction"),
        ({"test_fraction": 0.6, "public_fraction": 0.4}, "data.test_fraction + data.public_fraction"),
        ({"max_train": -1}, "data.max_train"),
        ({"max_train": 2.5}, "data.max_train"),
        ({"max_test": -1}, "data.max_test"),
        ({"max_test": True}, "data.max_test"),
        ({"image_size": 3}, "data.image_size"),
        ({"split_seed": -1}, "data.split_seed"),
        ({"split_seed": 2**64}, "data.split_seed"),
        ({"split_seed": True}, "data.split_seed"),
        ({"download": "yes"}, "data.download"),
        ({"name": "synthetic", "synthetic": SyntheticConfig(shape=[1, 8])}, "data.synthetic.shape"),
        ({"name": "synthetic", "synthetic": SyntheticConfig(shape=[1, 0, 8])}, "data.synthetic.shape"),
        ({"name": "synthetic", "synthetic": SyntheticConfig(shape=[1, 8, "8"])}, "data.synthetic.shape"),
        ({"name": "synthetic", "synthetic": SyntheticConfig(classes=1, size=10)}, "data.synthetic.classes"),
        ({"name": "synthetic", "synthetic": SyntheticConfig(classes=10, size=5)}, "data.synthetic.size"),
        # 10 examples: test round(5.0)=5, public round(4.9)=5 -> empty private pool.
        (
            {"name": "synthetic", "synthetic": SyntheticConfig(classes=2, size=10), "test_fraction": 0.5,
             "public_fraction": 0.49},
            "data.public_fraction",
        ),
    ],
)
def test_validation_names_the_field(overrides: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_task(cfg_with(**overrides))
    message = str(info.value)
    assert message.startswith(f"{field}:"), message
    assert "\n" not in message


def test_validation_message_says_what_is_allowed() -> None:
    with pytest.raises(ConfigError) as info:
        load_task(cfg_with(test_fraction=1.5))
    assert str(info.value) == "data.test_fraction: must be in [0, 1), got 1.5"


def test_synthetic_fields_ignored_for_other_datasets() -> None:
    task = load_task(cfg_with(synthetic=SyntheticConfig(classes=1)))
    assert task.dataset == "digits"


def test_normalize_none_feeds_the_pixels_unchanged() -> None:
    auto, raw = load_task(cfg_with(name="digits")), load_task(cfg_with(name="digits", normalize="none"))
    assert raw.mean == (0.0,) and raw.std == (1.0,)
    assert auto.mean != raw.mean and torch.equal(auto.train.x, raw.train.x)  # the data, not the model input


def test_another_dataset_stands_in_as_the_public_split() -> None:
    """digits with a 3-channel 16×16 synthetic public source: the public split is the synthetic set's own public
    share, turned grey by luma and resized to 8×8 (as computed here by hand); the private pool and test split are
    those of digits without a public share; the normalisation follows the new public split."""
    import torch.nn.functional as F

    syn = SyntheticConfig(shape=[3, 16, 16], classes=4, size=400)
    task = load_task(cfg_with(name="digits", public_source="synthetic", public_fraction=0.25, synthetic=syn))
    own = load_task(cfg_with(name="digits", public_fraction=0.0))
    source = load_task(cfg_with(name="synthetic", public_fraction=0.25, synthetic=syn, max_train=1))
    assert torch.equal(task.train.x, own.train.x) and torch.equal(task.test.x, own.test.x)
    grey = (0.299 * source.public.x[:, 0] + 0.587 * source.public.x[:, 1] + 0.114 * source.public.x[:, 2])
    expected = F.interpolate(grey.unsqueeze(1), size=(8, 8), mode="bilinear", antialias=True, align_corners=False)
    assert task.public.x.shape == (100, 1, 8, 8)
    assert torch.allclose(task.public.x, expected.clamp(0, 1), atol=1e-6)
    assert torch.equal(task.public.source_index, source.public.source_index)
    assert task.mean == pytest.approx((float(task.public.x.mean()),), rel=1e-6)


@pytest.mark.parametrize("overrides,message", [
    ({"public_source": "digits"}, "names the dataset itself"),
    ({"public_source": "nope"}, "unknown dataset 'nope'"),
    ({"public_source": "synthetic", "public_fraction": 0.0}, "data.public_fraction: must be > 0"),
    ({"public_source": "tokens"}, "only image datasets"),
])
def test_a_public_source_that_cannot_serve_is_refused(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_task(cfg_with(name="digits", **overrides))

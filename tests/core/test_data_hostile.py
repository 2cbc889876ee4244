"""Hostile data inputs: folders and files built to hang, exhaust memory, repeat examples or crash a loader mid-run.

Each is refused before anything trains, in one line naming the path or the setting (ConfigError; exit 2 through
the CLI, nothing written). Cases that used to hang run under a timeout, so a regression fails instead of blocking
the suite.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch

from dpeval.core.datasets import load_task
from dpeval.core.errors import ConfigError
from dpeval.core.settings import DataConfig


def config(**overrides) -> DataConfig:
    return dataclasses.replace(DataConfig(), **overrides)


def refusal(cfg: DataConfig, *names: str) -> str:
    """The one-line ConfigError loading ``cfg`` raises; it names every one of ``names``."""
    with pytest.raises(ConfigError) as info:
        load_task(cfg)
    message = str(info.value)
    assert "\n" not in message and all(name in message for name in names), message
    return message


# --------------------------------------------------------------------------------------------- imagefolder


def image_tree(root: Path, classes: tuple[str, ...] = ("cat", "dog"), per_class: int = 3) -> Path:
    from PIL import Image

    for k, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (5, 5), (40 * k, 10 * i, 0)).save(root / name / f"{i}.png")
    return root


def imagefolder(root: Path) -> DataConfig:
    return config(name="imagefolder", root=str(root), image_size=4)


@pytest.mark.timeout(30)
def test_imagefolder_refuses_a_symlink_loop_naming_it(tmp_path):
    """``ln -s .. cat/up`` used to make the walk run forever (every class again under every ``up``)."""
    root = image_tree(tmp_path / "imgs")
    (root / "cat" / "up").symlink_to("..")
    refusal(imagefolder(root), f"{root / 'cat' / 'up'} is a link to a folder")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("where,target", [
    ("cat/dogs", "../dog"),     # back into the tree: the dog images would count as cats too
    ("cat/more", "{outside}"),  # out of the tree
    ("bird", "{outside}"),      # a class folder that is a link
])
def test_imagefolder_follows_no_link_to_a_folder(tmp_path, where, target):
    root = image_tree(tmp_path / "imgs")
    outside = image_tree(tmp_path / "elsewhere", classes=("x",)) / "x"
    (root / where).symlink_to(target.format(outside=outside))
    refusal(imagefolder(root), f"{root / where} is a link to a folder")


@pytest.mark.timeout(30)
def test_imagefolder_refuses_a_fifo_named_like_an_image(tmp_path):
    """Opening a FIFO waits for a writer: the loader used to block forever."""
    root = image_tree(tmp_path / "imgs")
    os.mkfifo(root / "dog" / "9.png")
    refusal(imagefolder(root), f"{root / 'dog' / '9.png'} is not a regular file")


@pytest.mark.timeout(30)
def test_imagefolder_refuses_a_link_to_a_device(tmp_path):
    root = image_tree(tmp_path / "imgs")
    (root / "dog" / "zero.png").symlink_to("/dev/zero")
    refusal(imagefolder(root), f"{root / 'dog' / 'zero.png'} is not a regular file")


@pytest.mark.parametrize("how", ["hard link", "symlink"])
def test_imagefolder_never_counts_one_file_twice(tmp_path, how):
    """The same file under two names would sit in two roles (train and test) or two classes."""
    root = image_tree(tmp_path / "imgs")
    original, twin = root / "cat" / "0.png", root / "dog" / "twin.png"
    if how == "hard link":
        os.link(original, twin)
    else:
        twin.symlink_to(original)
    refusal(imagefolder(root), str(original), str(twin), "same file")


def test_imagefolder_reads_a_link_to_an_image_once(tmp_path):
    """A link to a regular file that appears nowhere else in the tree is an image like any other."""
    root = image_tree(tmp_path / "imgs")
    image_tree(tmp_path / "elsewhere", classes=("x",), per_class=1)
    (root / "dog" / "linked.png").symlink_to(tmp_path / "elsewhere" / "x" / "0.png")
    task = load_task(dataclasses.replace(imagefolder(root), test_fraction=0.0, public_fraction=0.0))
    assert len(task.train) == 7 and int((task.train.y == 1).sum()) == 4


def test_imagefolder_keeps_torchvision_order(tmp_path):
    """Without links the examples keep ImageFolder's order (classes sorted, each folder's walk sorted), so every
    split drawn before stays the same."""
    from torchvision.datasets import ImageFolder

    from dpeval.core.datasets.imagefolder import image_files

    root = image_tree(tmp_path / "imgs", classes=("b", "a", "a.b"))
    image_tree(root / "a" / "sub", classes=("z", "y"), per_class=2)
    (root / "a" / "sub" / "notes.txt").write_text("not an image")
    assert image_files(root)[1] == ImageFolder(str(root)).samples
    task = load_task(imagefolder(root))
    assert task.num_classes == 3 and len(task.train) + len(task.test) + len(task.public) == 13
    assert torch.equal(torch.cat([task.train.source_index, task.test.source_index, task.public.source_index])
                       .sort().values, torch.arange(13))


# --------------------------------------------------------------------------------------------- textfile, idx files


def textfile(path: Path | str, length: int = 4) -> DataConfig:
    return config(name="textfile", root=str(path), tokens=dataclasses.replace(DataConfig().tokens, length=length))


@pytest.mark.timeout(30)
def test_textfile_refuses_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "corpus.txt")
    refusal(textfile(tmp_path / "corpus.txt"), f"{tmp_path / 'corpus.txt'} (not a regular file)")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_textfile_refuses_a_device_without_reading_it(device):
    """/dev/zero used to be read until memory ran out."""
    refusal(textfile(device), f"{device} (not a regular file)")


def test_textfile_refuses_a_file_over_the_size_limit_without_reading_it(tmp_path, monkeypatch):
    from dpeval.core.datasets import tokens

    monkeypatch.setattr(tokens, "MAX_TEXTFILE_BYTES", 1000)
    (tmp_path / "at.txt").write_bytes(b"abcd" * 250)
    assert len(load_task(textfile(tmp_path / "at.txt")).train) > 0
    (tmp_path / "over.txt").write_bytes(b"abcd" * 250 + b"e")
    message = refusal(textfile(tmp_path / "over.txt"), str(tmp_path / "over.txt"), "1000 bytes")
    assert len(message) < 300


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="needs Linux procfs")
def test_textfile_bounds_the_read_where_the_size_says_nothing(monkeypatch):
    """A procfs file is regular and says it is empty: the read itself stops one byte past the limit."""
    from dpeval.core.datasets import tokens

    monkeypatch.setattr(tokens, "MAX_TEXTFILE_BYTES", 100)
    assert os.stat("/proc/self/maps").st_size == 0
    refusal(textfile("/proc/self/maps"), f"/proc/{os.getpid()}/maps holds more than 100 bytes")


def gzip_bomb(path: Path, declared: int, trailing: int) -> Path:
    """A gzip-compressed idx file of ``declared`` bytes of data, followed by ``trailing`` more bytes."""
    import gzip

    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(bytes([0, 0, 8, 1]) + declared.to_bytes(4, "big") + b"\0" * declared)
        chunk = b"\0" * (1 << 20)
        for _ in range(trailing >> 20):
            f.write(chunk)
    return path


@pytest.mark.timeout(60)
def test_a_compressed_idx_file_is_never_inflated_past_its_header(tmp_path):
    """64 MiB of zeros (64 kB compressed) behind a header that declares 1000 bytes: at most the declared bytes and a
    little slack are ever inflated (Python allocations traced)."""
    import tracemalloc

    from dpeval.core.datasets.torchvision_sets import read_idx

    path = gzip_bomb(tmp_path / "train-labels-idx1-ubyte.gz", 1000, 64 << 20)
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="train-labels-idx1-ubyte.gz holds more data bytes"):
            read_idx(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak


@pytest.mark.timeout(30)
def test_an_idx_file_that_is_not_a_regular_file_is_refused(tmp_path):
    from dpeval.core.datasets.torchvision_sets import read_idx

    os.mkfifo(tmp_path / "t10k-labels-idx1-ubyte")
    for path in (tmp_path / "t10k-labels-idx1-ubyte", Path("/dev/zero")):
        with pytest.raises(ValueError, match="not a regular file"):
            read_idx(path)


# --------------------------------------------------------------------------------------------- MNIST family, CIFAR-10


def run_cli(tmp_path: Path, *args: str):
    """``dpeval run`` in-process with a results folder under ``tmp_path``; its exit code, its one stderr line, and
    whether the results folder was written."""
    from click.testing import CliRunner

    from dpeval.cli import main

    results = tmp_path / "results"
    result = CliRunner().invoke(main, ["run", *args, "--epochs", "1", "--results", str(results)])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return result.exit_code, lines[0], results.exists()


def corrupt_gzip(path: Path) -> Path:
    import gzip

    blob = bytearray(gzip.compress(path.read_bytes()))
    blob[len(blob) // 2] ^= 0xFF
    path.unlink()
    gz = path.with_name(path.name + ".gz")
    gz.write_bytes(bytes(blob))
    return gz


@pytest.fixture
def system_fashionmnist(tmp_path, monkeypatch) -> Path:
    """Fashion-MNIST's idx files (gzip-compressed, as Debian ships them) in a system folder that the loader
    searches; data.root (``tmp_path / 'data'``) holds nothing."""
    import gzip

    from dpeval.core.datasets import torchvision_sets
    from tests.torchvision_files import make_mnist_like

    make_mnist_like(tmp_path / "system", "FashionMNIST", 30, 10)
    folder = tmp_path / "system" / "FashionMNIST" / "raw"
    for path in list(folder.iterdir()):
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()
    monkeypatch.setattr(torchvision_sets, "SYSTEM_FOLDERS", {"FashionMNIST": (folder,)})
    return folder


def test_a_corrupt_gzip_idx_file_in_data_root_exits_2_naming_it(tmp_path):
    from tests.torchvision_files import make_mnist_like

    make_mnist_like(tmp_path / "data", "MNIST", 30, 10)
    corrupt_gzip(tmp_path / "data" / "MNIST" / "raw" / "train-images-idx3-ubyte")
    code, line, written = run_cli(tmp_path, "--dataset", "mnist", "--set", f"data.root={tmp_path / 'data'}")
    assert code == 2 and "train-images-idx3-ubyte.gz" in line and not written, line


def test_a_corrupt_gzip_idx_file_in_a_system_folder_exits_2_naming_it(tmp_path, system_fashionmnist):
    import gzip

    path = system_fashionmnist / "t10k-images-idx3-ubyte.gz"
    blob = bytearray(gzip.compress(gzip.decompress(path.read_bytes()), compresslevel=1))
    blob[len(blob) // 2] ^= 0xFF
    path.write_bytes(bytes(blob))
    code, line, written = run_cli(tmp_path, "--dataset", "fashionmnist", "--set", f"data.root={tmp_path / 'data'}")
    assert code == 2 and f"{system_fashionmnist} could not be read (t10k-images-idx3-ubyte.gz: " in line, line
    assert not written


def test_train_and_test_images_of_different_sizes_exit_2_naming_both(tmp_path, system_fashionmnist):
    import gzip

    import numpy as np

    from tests.torchvision_files import write_idx

    plain = system_fashionmnist / "t10k-images-idx3-ubyte"
    write_idx(plain, np.zeros((10, 20, 20), dtype=np.uint8))
    plain.with_name(plain.name + ".gz").write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    code, line, written = run_cli(tmp_path, "--dataset", "fashionmnist", "--set", f"data.root={tmp_path / 'data'}")
    assert code == 2 and "(28, 28)" in line and "(20, 20)" in line and not written, line


def test_no_loader_can_hand_over_train_and_test_images_of_different_shapes():
    """What a loader (a plug-in's too) assembles is checked: images of two shapes would fail inside a matmul."""
    from dpeval.core.splits import assemble

    labels = torch.arange(6) % 2
    with pytest.raises(ConfigError, match=r"training images \(1, 8, 8\), test images \(3, 8, 8\)"):
        assemble(config(name="mnist"), 2, torch.zeros(6, 1, 8, 8), labels, torch.zeros(6, 3, 8, 8), labels)


def test_an_installed_array_whose_header_declares_too_much_is_refused_before_reading(tmp_path, monkeypatch):
    """CIFAR-10's installed arrays are checked header-first: a header that declares 140 TiB used to end in a
    MemoryError traceback."""
    import tracemalloc

    import numpy as np

    from dpeval.core.datasets import packaged

    folder = tmp_path / "home" / packaged.CIFAR10.folder
    folder.mkdir(parents=True)
    for file, shape in packaged.CIFAR10_SHAPES.items():
        np.save(folder / file, np.zeros((1,) + shape[1:], dtype=np.uint8))
    with open(folder / "train_images.npy", "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "|u1", "fortran_order": False,
                                                 "shape": (50_000_000_000, 32, 32, 3)})
        f.write(b"\0" * 100)
    monkeypatch.setenv("DPEVAL_DATA", str(tmp_path / "home"))
    tracemalloc.start()
    try:
        refusal(config(name="cifar10", root=str(tmp_path / "nothing")), str(folder / "train_images.npy"),
                "(50000000000, 32, 32, 3)")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak


# --------------------------------------------------------------------------------------------- float32 settings


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args,key", [
    (["--set", "train.weight_decay=1e39"], "train.weight_decay"),
    (["--set", "defense.clip=1e308"], "defense.clip"),
    (["--defense", "adaclip", "--set", "defense.h2=1e39"], "defense.h2"),
    (["--defense", "adaclip", "--set", "defense.h1=1e-50"], "defense.h1"),  # 0 as float32: b = 0, w = inf
    (["--defense", "adaclip", "--set", "defense.h1=1e20", "--set", "defense.h2=1e30"], "defense.h2"),  # h1·h2
    (["--set", "privacy.noise_multiplier=1e10", "--set", "defense.clip=1e30"], "defense.clip"),  # σ·C
    (["--set", "defense.clip=1e38"], "defense.clip"),  # σ·C a float32, but not every draw of its noise
    (["--defense", "gep", "--set", "privacy.noise_multiplier=1e10", "--set", "defense.clip1=1e30"],
     "defense.clip1"),
])
def test_a_setting_beyond_float32_exits_2_naming_it_before_training(tmp_path, args, key):
    """These passed the range checks and failed after the run had started: 'value cannot be converted to type float
    without overflow', or training diverged and the message blamed train.lr."""
    code, line, written = run_cli(tmp_path, *args)
    assert code == 2 and line.startswith(f"dpeval: error: {key}: ") and "float32" in line and not written, line
    assert "train.lr" not in line and len(line) < 300


def test_every_float_setting_is_checked_where_it_is_declared():
    from dpeval.core.params import FLOAT32_MAX, from_dict
    from dpeval.core.settings import TrainConfig

    assert from_dict(TrainConfig, {"weight_decay": FLOAT32_MAX}, "train").weight_decay == FLOAT32_MAX
    assert from_dict(TrainConfig, {"weight_decay": 0}, "train").weight_decay == 0
    for value in (3.5e38, 1e-46):
        with pytest.raises(ConfigError, match=r"^train\.weight_decay: .*float32"):
            from_dict(TrainConfig, {"weight_decay": value}, "train")
    with pytest.raises(ConfigError, match=r"^train\.lr: .*float32"):
        from_dict(TrainConfig, {"lr": 1e39}, "train")


# --------------------------------------------------------------------------------------------- data.root itself


@pytest.mark.parametrize("dataset", ["imagefolder", "textfile", "mnist"])
@pytest.mark.parametrize("root", ["x" * 5000, "a/" + "y" * 300 + "/b"])
def test_a_path_no_system_can_open_exits_2_without_repeating_it(tmp_path, dataset, root):
    """A data.root longer than a path or a name may be used to end in an 'OSError: File name too long'
    traceback, or in a message that repeated all of it, twice."""
    code, line, written = run_cli(tmp_path, "--dataset", dataset, "--set", f"data.root={root}")
    assert code == 2 and line.startswith("dpeval: error: data.root: ") and len(line) < 300 and not written, line

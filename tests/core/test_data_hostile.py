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

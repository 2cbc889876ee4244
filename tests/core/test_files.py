"""The atomic writer: figures are reproducible (a regenerated committed figure diffs empty), and only a regular file
is ever replaced (a device, a FIFO, a socket or a folder at the target is refused, nothing written)."""
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from dpeval.core.files import save_figure  # noqa: E402


def draw(path):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1, 2], [1, 0, 2], marker="o", label="a")
    ax.legend()
    save_figure(fig, path)
    plt.close(fig)
    return path.read_bytes()


@pytest.mark.parametrize("suffix", [".svg", ".pdf", ".png"])
def test_the_same_figure_is_the_same_bytes(tmp_path, suffix):
    first = draw(tmp_path / f"a{suffix}")
    assert draw(tmp_path / f"b{suffix}") == first


def test_svg_carries_no_date_and_fixed_ids(tmp_path):
    import matplotlib.pyplot as plt

    text = draw(tmp_path / "a.svg").decode()
    assert "<dc:date>" not in text
    # plain savefig (a random salt, today's date) differs between two draws: the control
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0], marker="o")
    fig.savefig(tmp_path / "c.svg")
    fig.savefig(tmp_path / "d.svg")
    plt.close(fig)
    assert (tmp_path / "c.svg").read_bytes() != (tmp_path / "d.svg").read_bytes()


# ------------------------------------------------------------------ only a regular file is ever replaced

def null_device(path):
    """A character device at ``path`` with /dev/null's numbers, made in the test's own folder (so a writer that
    replaced it would harm nothing); skipped where the system allows no device nodes."""
    import os
    import stat

    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    return path


def special_files(tmp_path):
    """A FIFO, a unix socket, a character device and a folder, each where an output file could be named."""
    import os
    import socket

    os.mkfifo(tmp_path / "fifo.csv")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock.csv"))
    server.close()
    (tmp_path / "folder.csv").mkdir()
    return {"a FIFO": tmp_path / "fifo.csv", "a socket": tmp_path / "sock.csv", "a folder": tmp_path / "folder.csv"}


@pytest.mark.parametrize("kind", ["a FIFO", "a socket", "a folder"])
def test_the_writer_never_replaces_a_special_file(tmp_path, kind):
    from dpeval.core.errors import ConfigError
    from dpeval.core.files import write_text_atomic

    path = special_files(tmp_path)[kind]
    mode = path.lstat().st_mode
    with pytest.raises(ConfigError, match=f"{kind}.*not a regular file"):
        write_text_atomic(path, "x")
    assert path.lstat().st_mode == mode  # still what it was, not a regular file renamed over it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo.csv", "folder.csv", "sock.csv"]  # no temporary


def test_the_writer_never_replaces_a_device(tmp_path, monkeypatch):
    """``--out /dev/full`` used to rename a file over the device. Checked on a device node made in tmp_path, with
    the rename itself made to fail the test, so even a broken check replaces nothing."""
    import os
    import stat

    from dpeval.core import files
    from dpeval.core.errors import ConfigError

    device = null_device(tmp_path / "full")
    monkeypatch.setattr(files.os, "replace", lambda *a: pytest.fail("renamed over a device"))
    with pytest.raises(ConfigError, match="full is a character device, not a regular file"):
        files.write_text_atomic(device, "x")
    assert stat.S_ISCHR(os.lstat(device).st_mode)
    assert os.listdir(tmp_path) == ["full"]


def test_the_check_reads_only_the_metadata_of_a_real_device():
    """/dev/null itself is looked at (lstat), never opened or written: the refusal comes first."""
    from dpeval.core.files import special_kind

    assert special_kind("/dev/null") == "a character device"


def test_a_regular_file_and_a_link_are_still_replaced(tmp_path):
    """The control: an earlier output is replaced whole; a link at the target is replaced as a link."""
    from dpeval.core.files import write_text_atomic

    (tmp_path / "old.csv").write_text("old")
    (tmp_path / "elsewhere").write_text("kept")
    (tmp_path / "link.csv").symlink_to(tmp_path / "elsewhere")
    write_text_atomic(tmp_path / "old.csv", "new")
    write_text_atomic(tmp_path / "link.csv", "new")
    assert (tmp_path / "old.csv").read_text() == "new"
    assert not (tmp_path / "link.csv").is_symlink() and (tmp_path / "elsewhere").read_text() == "kept"

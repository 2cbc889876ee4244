"""Every file dpeval writes goes through ``write_atomic``: a reader, a full disk or a kill never leaves half a
file at the target, and an existing file is replaced whole or not at all.

The bytes go to a fresh temporary file beside the target (created exclusively, so never through a link planted
at its name), are flushed to the disk, then renamed over the target (a rename replaces a link at the target, it
does not write through it). On any error the temporary file is closed (a file held open keeps its space on a
full disk) and removed. A folder that is written into again (an interrupted run's) must hold no link at all
(``refuse_links``): a linked folder would take every write elsewhere.

Only a regular file (or a link, replaced as a link) is ever replaced: a device (``--out /dev/full`` renamed over
would remove the device for every program on the machine), a FIFO, a socket or a folder at the target is refused
(``refuse_special``, :class:`ConfigError` naming the path and what it is) before anything is written, and looked at
again just before the rename.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any, BinaryIO, Callable

from dpeval.core.errors import ConfigError, printable

KINDS = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO (named pipe)",
         stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a folder"}


def plain_name(name: object) -> bool:
    """Whether ``name`` is one plain folder or file name, so that ``folder / name`` stays inside ``folder``: a
    non-empty string of at most 255 characters starting with a letter or digit (never ``.``, ``..`` or ``-``), with
    no path separator, NUL or control character."""
    return (isinstance(name, str) and 0 < len(name) <= 255 and name[0].isalnum() and name.isprintable()
            and not any(c in name for c in "/\\\0"))


def inside(folder: str | Path, name: str, what: str) -> Path:
    """``folder / name`` for a ``name`` taken from a store or a registry; ConfigError naming ``what`` when it is not
    a plain name (``plain_name``): a path dpeval derives never leads outside its folder."""
    if not plain_name(name):
        raise ConfigError(f"{what} {printable(repr(name), 120)} is not a plain name (one name starting with a "
                          f"letter or digit, without a path separator or control character); dpeval derives no "
                          f"path from it")
    return Path(folder) / name


def special_kind(path: str | Path) -> str | None:
    """What ``path`` is when it exists and is neither a regular file nor a symbolic link (not followed): "a
    character device", "a FIFO (named pipe)", ...; None otherwise (also when it cannot be looked at: the write
    then fails with the system's own reason)."""
    try:
        mode = os.lstat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
        return None
    return KINDS.get(stat.S_IFMT(mode), "not a regular file")


def refuse_special(path: str | Path, option: str | None = None) -> None:
    """ConfigError (naming ``option`` when given) when ``path`` is a device, a FIFO, a socket or a folder: dpeval
    writes only regular files, and never replaces anything else."""
    kind = special_kind(path)
    if kind is not None:
        where = f"{option}: " if option else ""
        raise ConfigError(f"{where}{printable(path, 200)} is {kind}, not a regular file; dpeval never writes over "
                          f"one: name a regular file (a new path or an earlier output)")


def write_atomic(path: str | Path, write: Callable[[BinaryIO], Any]) -> None:
    """``write(f)`` into a temporary file ``f`` (binary, opened for writing) beside ``path``, then rename it to
    ``path``; an OSError (e.g. ENOSPC) leaves ``path`` as it was. ConfigError, with nothing written, when ``path``
    is not a regular file (``refuse_special``)."""
    path = Path(path)
    refuse_special(path)  # before the temporary file: nothing is created beside a device
    tmp = path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        refuse_special(path)  # again: one may have been made there while the bytes were written
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    write_atomic(path, lambda f: f.write(text.encode()))


def write_json_atomic(path: str | Path, data: Any, **dumps: Any) -> None:
    write_text_atomic(path, json.dumps(data, default=str, **dumps))


def save_figure(fig: Any, path: str | Path, **savefig: Any) -> None:
    """A matplotlib figure to ``path``, in the format its suffix names, byte for byte the same each time it is drawn
    from the same data: no creation date and fixed SVG element ids, so a regenerated committed figure diffs empty."""
    import matplotlib

    path = Path(path)
    fmt = path.suffix.lstrip(".")
    savefig.setdefault("metadata", {"svg": {"Date": None}, "pdf": {"CreationDate": None}}.get(fmt))
    with matplotlib.rc_context({"svg.hashsalt": "dpeval"}):
        write_atomic(path, lambda f: fig.savefig(f, format=fmt, **savefig))


def refuse_links(folder: str | Path) -> None:
    """ConfigError naming the first symbolic link that is ``folder`` or lies under it (not followed)."""
    folder = Path(folder)
    found = [folder] if folder.is_symlink() else []
    for parent, dirs, names in os.walk(folder):
        found += [Path(parent) / name for name in sorted(dirs + names) if (Path(parent) / name).is_symlink()]
        if found:
            raise ConfigError(f"{found[0]} is a symbolic link; dpeval never writes through one into a run's "
                              f"folder: remove it (rm {found[0]}) and run the same command again")


class NotRegularFile(OSError):
    """A FIFO, a device, a socket or a folder where a data file is expected (``strerror``: "not a regular file")."""


def check_regular(path: Path | str, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise NotRegularFile(errno.EINVAL, "not a regular file", str(path))


def open_regular(path: Path | str) -> BinaryIO:
    """``path`` opened for binary reading, only if it is a regular file (links followed): a FIFO would block the
    loader, a device (``/dev/zero``) never end. Raises OSError (:class:`NotRegularFile` for anything not regular);
    its ``strerror`` says what is wrong without the path."""
    check_regular(path, os.stat(path).st_mode)  # before opening: opening a device can itself act
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # never waits for a FIFO's writer (one may appear meanwhile)
    try:
        check_regular(path, os.fstat(fd).st_mode)  # what was opened, not what the name meant a moment ago
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


_DIGESTS: dict[tuple[Any, ...], str] = {}


def file_digest(path: str | Path) -> str | None:
    """The SHA-256 of a regular file's bytes (None when it is not one or cannot be read: whoever uses the file
    says why), remembered per (file, size, modification time) so that a key computed often reads it once."""
    try:
        with open_regular(path) as f:
            info = os.fstat(f.fileno())
            key = (os.path.abspath(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
            if key not in _DIGESTS:
                digest = hashlib.sha256()
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
                _DIGESTS[key] = digest.hexdigest()
            return _DIGESTS[key]
    except OSError:
        return None

"""Helpers shared by the dataset loaders (no datasets are registered here)."""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import BinaryIO

from dpeval.core.settings import DataConfig


def one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def abs_root(cfg: DataConfig) -> Path:
    return Path(os.path.expanduser(str(cfg.root))).resolve()


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

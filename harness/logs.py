"""Where the ``dpeval`` logger's records go: the run's ``log.txt`` gets everything (INFO: per-epoch lines,
and a failed run's traceback); the terminal gets warnings only, and a traceback only with ``--debug``.

A record logged with ``extra=LOG_ONLY`` (the traceback of a failed run) is meant for the log file: the
terminal says the failure in one line (the CLI's message), unless ``--debug`` asks for the traceback.
"""

from __future__ import annotations

import logging
import os
import stat
import sys
from pathlib import Path
from typing import Any

from dpeval.core.errors import ConfigError
from dpeval.core.files import refuse_special

LOG_ONLY = {"log_only": True}


class StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted (not the stream of the first call), so
    warnings of a command invoked in-process reach that command's stderr."""

    def __init__(self, debug: bool) -> None:
        super().__init__()
        self.debug = debug
        # Per-epoch lines go to the run's log file; the terminal gets the progress bar and warnings.
        self.setLevel(logging.WARNING)
        self.setFormatter(logging.Formatter("%(message)s"))

    def filter(self, record: logging.LogRecord) -> bool:
        return (self.debug or not getattr(record, "log_only", False)) and super().filter(record)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


class RunLogHandler(logging.FileHandler):
    """A run's ``log.txt``, appended to, never opened through a link (``O_NOFOLLOW``: OSError ELOOP) and only when
    it is a regular file (a FIFO there would block the run, a device take its log: ConfigError naming it)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, encoding="utf-8")
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))

    def _open(self) -> Any:
        refuse_special(self.baseFilename)  # before opening: opening a FIFO for writing waits for a reader
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                     | os.O_NONBLOCK, 0o644)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # what was opened, not what the name meant a moment ago
                raise ConfigError(f"{self.baseFilename} is not a regular file; dpeval writes a run's log only into one")
            os.set_blocking(fd, True)
            return open(fd, "a", encoding=self.encoding)
        except BaseException:
            os.close(fd)
            raise


def setup_logging(debug: bool = False, terminal: bool = True) -> None:
    """INFO records reach the handlers a run attaches (its log file); ``terminal`` adds the stderr handler
    (a sweep's worker processes have none unless ``debug``: their lines go to each run's log)."""
    logger = logging.getLogger("dpeval")
    logger.setLevel(logging.INFO)
    for handler in [h for h in logger.handlers if isinstance(h, (StderrHandler, logging.NullHandler))]:
        logger.removeHandler(handler)
    # NullHandler: without any handler, Python's last-resort handler would print warnings to stderr.
    logger.addHandler(StderrHandler(debug) if terminal else logging.NullHandler())
    logger.propagate = False

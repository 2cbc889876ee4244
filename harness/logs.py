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
from typing import Any, Callable

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


class _ToCallersHandlers(logging.Handler):
    """Hands a record to the handlers of the ``dpeval`` logger's parents (or Python's last-resort handler), as
    propagation would have: ``open_run_log`` stops propagation while it lets INFO records reach the run's log."""

    def emit(self, record: logging.LogRecord) -> None:
        parent = logging.getLogger("dpeval").parent
        if parent is not None:
            parent.handle(record)


def open_run_log(path: Path) -> Callable[[], None]:
    """Attach the run's ``log.txt`` (``RunLogHandler``) to the ``dpeval`` logger; returns the function that detaches
    and closes it. The CLI and a sweep's workers set the logger to INFO (``setup_logging``); a caller of the Python
    API usually sets nothing, and INFO records (the per-sample engine chosen and why, each epoch's accuracy) would
    then never reach the file. So, while the log is open and only when no level is set on the logger itself, it is
    set to INFO and stops propagating, and a handler at the caller's former level passes on what the caller's own
    handlers got before: a caller's logging prints no more than it did."""
    logger = logging.getLogger("dpeval")
    handler = RunLogHandler(path)
    logger.addHandler(handler)
    former, propagate = logger.getEffectiveLevel(), logger.propagate
    forward = None
    if logger.level == logging.NOTSET and former > logging.INFO and propagate:
        forward = _ToCallersHandlers(former)
        logger.addHandler(forward)
        logger.setLevel(logging.INFO)
        logger.propagate = False

    def close() -> None:
        logger.removeHandler(handler)
        handler.close()
        if forward is not None:
            logger.removeHandler(forward)
            logger.setLevel(logging.NOTSET)
            logger.propagate = propagate

    return close


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

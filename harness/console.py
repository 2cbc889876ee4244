"""How every ``dpeval`` command talks to the terminal: one-line errors and their exit codes (2 bad input, 1 runtime
failure, 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP), click's usage errors in one line, progress bars ended before a
message, output files whose write errors name the option, and the result printed (``--json``: one object)."""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any, Callable

import click

from dpeval.core.errors import ConfigError, RunFailure, printable


def one_line(message: object) -> str:
    """A message as one terminal line: its lines joined, control characters escaped, length capped."""
    return printable(" ".join(str(message).splitlines()))


def fail_usage(message: str) -> None:
    click.echo(f"dpeval: error: {one_line(message)}", err=True)
    sys.exit(2)


class Terminated(KeyboardInterrupt):
    """SIGTERM (sent by Slurm, ``timeout``, container stops) or SIGHUP (a closed terminal or SSH session)
    raised like Ctrl-C, so a run in progress is recorded as ``failed`` on the way out instead of staying
    ``running``, and a sweep's workers are stopped with it. Exit code 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


TERMINATING = (signal.SIGTERM, signal.SIGHUP)


@contextmanager
def sigterm_raises() -> Iterator[list[int]]:
    """While a command runs, SIGTERM and SIGHUP raise :class:`Terminated` in the main thread (once: a second
    one during the bookkeeping gets the default action). Yields the signals received: a library that swallows the
    exception (one raised inside a callback or a finaliser is only printed) must not turn it into exit 0."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def on_term(signum: int, frame: Any) -> None:
        for sig in TERMINATING:
            signal.signal(sig, signal.SIG_DFL)
        received.append(signum)
        raise Terminated(signum)

    previous = {sig: signal.signal(sig, on_term) for sig in TERMINATING}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def end_progress_bars() -> None:
    """Finish any progress bar still on the terminal with a newline, so a message printed next starts on
    its own line instead of being glued to the bar."""
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", ())):
        bar.leave = True
        bar.close()


def handle_errors(func: Callable) -> Callable:
    """Map ConfigError → exit 2 and RunFailure → exit 1, each as one line on stderr; Ctrl-C → 130,
    SIGTERM → 143 and SIGHUP → 129, with one line saying so."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with sigterm_raises() as received:
                result = func(*args, **kwargs)
            if received:  # the signal's exception was swallowed on the way: the command still ends with its code
                raise Terminated(received[0])
            return result
        except ConfigError as exc:
            end_progress_bars()
            fail_usage(str(exc))
        except RunFailure as exc:
            end_progress_bars()
            click.echo(f"dpeval: {one_line(exc)}", err=True)
            sys.exit(1)
        except KeyboardInterrupt as exc:
            end_progress_bars()
            click.echo(f"dpeval: {one_line(exc) or 'interrupted'}", err=True)
            sys.exit(128 + exc.signum if isinstance(exc, Terminated) else 130)

    return wrapper


@contextmanager
def one_line_usage_errors() -> Iterator[None]:
    """click's usage errors (unknown option, bad value, missing argument) as one line, like every other
    bad input: ``dpeval: error: <what> (see '<command> -h')``."""
    try:
        yield
    except click.exceptions.NoArgsIsHelpError:
        raise
    except click.UsageError as exc:
        raise OneLineUsageError(exc.format_message(), exc.ctx) from None


class OneLineUsageError(click.UsageError):
    def show(self, file: Any = None) -> None:
        hint = f" (see '{self.ctx.command_path} -h')" if self.ctx is not None else ""
        click.echo(f"dpeval: error: {one_line(self.format_message())}{hint}", err=True)


class DpevalGroup(click.Group):
    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with one_line_usage_errors():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with one_line_usage_errors():
            return super().invoke(ctx)


@contextmanager
def writing(option: str, path: str) -> Iterator[None]:
    """An OSError while writing the file an option names is bad input naming that option and the path
    (exit 2)."""
    try:
        yield
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename and str(exc.filename) != path else ""
        raise ConfigError(f"{option}: cannot write {path}: {where}{exc.strerror or exc}") from None


def emit(data: Any, as_json: bool, text: str, recorded: str = "") -> None:
    """Print the result; stdout that cannot take it (a full device, a closed pipe) is one line naming
    ``recorded`` (where the result is kept anyway), exit 1."""
    try:
        click.echo(json.dumps(data, default=str) if as_json else text)
        sys.stdout.flush()
    except OSError as exc:
        silence_stdout()
        raise RunFailure(f"cannot write the output to stdout: {exc.strerror or exc}{recorded}") from None


def silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of what is still buffered cannot fail
    again with a traceback on the way out."""
    with suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())

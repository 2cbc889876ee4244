"""Error types that map onto the CLI's exit codes (2 = bad usage, 1 = runtime failure)."""

import reprlib


class ConfigError(ValueError):
    """Invalid user input: unknown name, out-of-range value, missing data folder, malformed YAML.

    The CLI prints the message as one line and exits with code 2. Messages must name the field and
    what is allowed, e.g. ``train.epochs: must be an integer >= 1, got 0``.
    """


class RunFailure(RuntimeError):
    """A run that started and then failed (the CLI exits with code 1)."""


def brief(value: object, limit: int = 80) -> str:
    """A repr of ``value`` of at most about ``limit`` characters, so an error about a huge value (a long
    string, a YAML alias expansion) stays one short line; ``reprlib`` never builds the full repr."""
    short = reprlib.Repr()
    short.maxstring = short.maxother = limit
    short.maxlist = short.maxtuple = short.maxdict = short.maxset = 8
    short.maxlevel = 3
    text = short.repr(value)
    return text if len(text) <= limit else f"{text[:limit]}…"

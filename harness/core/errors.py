"""Error types that map onto the CLI's exit codes (2 = bad usage, 1 = runtime failure), and how a value from
the user or a store is quoted in a message or on the terminal."""

import reprlib
import unicodedata


class ConfigError(ValueError):
    """Invalid user input: unknown name, out-of-range value, missing data folder, malformed YAML.

    The CLI prints the message as one line and exits with code 2. Messages must name the field and
    what is allowed, e.g. ``train.epochs: must be an integer >= 1, got 0``.
    """


class RunFailure(RuntimeError):
    """A run that started and then failed (the CLI exits with code 1)."""


LINE_LIMIT = 1000  # the longest line dpeval prints for a message or a stored value
# Characters a terminal does not just show: controls (ESC starts a terminal command, CR overwrites the line),
# line and paragraph separators, invisible format characters (right-to-left overrides reorder what is shown),
# lone surrogates (undecodable file names; printing them fails).
_HIDDEN = {"Cc", "Cf", "Zl", "Zp", "Cs"}


def printable(value: object, limit: int = LINE_LIMIT) -> str:
    """``str(value)`` made safe for one terminal line: every control or invisible character written as its
    escape (ESC as ``\\x1b``, a newline as ``\\n``), and at most ``limit`` characters, a longer text cut with
    "…". Everything dpeval prints that comes from a store or from the user goes through here."""
    text = str(value)
    cut = len(text) > limit
    text = text[:limit]  # before escaping: a huge value is never processed whole
    if not text.isprintable():
        text = "".join(c.encode("unicode_escape").decode("ascii") if unicodedata.category(c) in _HIDDEN else c
                       for c in text)
        cut = cut or len(text) > limit
    return f"{text[:limit]}…" if cut else text


def brief(value: object, limit: int = 80) -> str:
    """A repr of ``value`` of at most about ``limit`` characters, so an error about a huge value (a long
    string, a YAML alias expansion) stays one short line; ``reprlib`` never builds the full repr."""
    short = reprlib.Repr()
    short.maxstring = short.maxother = limit
    short.maxlist = short.maxtuple = short.maxdict = short.maxset = 8
    short.maxlevel = 3
    return printable(short.repr(value), limit)

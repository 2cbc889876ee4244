"""Every file dpeval writes goes through ``write_atomic``: a reader, a full disk or a kill never leaves half a
file at the target, and an existing file is replaced whole or not at all.

The bytes go to a fresh temporary file beside the target (created exclusively, so never through a link planted
at its name), are flushed to the disk, then renamed over the target (a rename replaces a link at the target, it
does not write through it). On any error the temporary file is closed (a file held open keeps its space on a
full disk) and removed. A folder that is written into again (an interrupted run's) must hold no link at all
(``refuse_links``): a linked folder would take every write elsewhere.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any, BinaryIO, Callable

from dpeval.core.errors import ConfigError


def write_atomic(path: str | Path, write: Callable[[BinaryIO], Any]) -> None:
    """``write(f)`` into a temporary file ``f`` (binary, opened for writing) beside ``path``, then rename it to
    ``path``; an OSError (e.g. ENOSPC) leaves ``path`` as it was."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
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

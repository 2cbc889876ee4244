"""Write generated Markdown into a docs page between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` lines, so a
measurement script can refresh its table in place without touching the prose around it."""

from __future__ import annotations

import sys
from pathlib import Path

from dpeval.core.files import write_text_atomic


def write_into(doc: Path, name: str, text: str) -> None:
    """Replace what lies between the two markers ``name`` of ``doc`` with ``text`` (both must be there, once)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    page = doc.read_text()
    if page.count(start) != 1 or page.count(end) != 1:
        sys.exit(f"{doc}: needs exactly one {start} and one {end} line")
    head, rest = page.split(start)
    write_text_atomic(doc, f"{head}{start}\n{text}\n{end}{rest.split(end, 1)[1]}")

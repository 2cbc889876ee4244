"""The configuration reference tables, generated from the parameter declarations.

docs/configuration.md holds blocks ``<!-- params: SECTION -->`` … ``<!-- /params -->``; each block is the
table of one section (``run``, ``data``, ``model``, ``privacy``, ``train``, ``defense:NAME``,
``attack:NAME``) rendered by :func:`table`. ``python -m harness.params_docs docs/configuration.md``
rewrites the blocks in place (after changing a declaration); a test fails when the file is out of date.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from harness.core.params import params_table
from harness.core.settings import DataConfig, ModelConfig, PrivacyConfig, TrainConfig

BLOCK = re.compile(r"(<!-- params: (?P<section>[\w:-]+) -->\n)(?P<body>.*?)(<!-- /params -->)", re.S)
SETTINGS = {"data": DataConfig, "model": ModelConfig, "privacy": PrivacyConfig, "train": TrainConfig}


def table(section: str) -> str:
    """The markdown table of one section (see the module docstring)."""
    from attacks import ATTACKS
    from defenses import DEFENSES
    from harness.config import RunSpec

    if section in SETTINGS:
        return params_table(SETTINGS[section], section)
    if section == "run":
        rows = params_table(RunSpec, "").split("\n")
        return "\n".join(rows[:2] + [r for r in rows[2:] if r.startswith(("| `seed`", "| `device`"))])
    kind, _, name = section.partition(":")
    if kind == "defense":
        return params_table(DEFENSES.get(name).Params, "defense")
    if kind == "attack":
        return params_table(ATTACKS.get(name).Params, "attack")
    raise KeyError(f"unknown params section {section!r}")


def render(text: str) -> str:
    """``text`` with every params block regenerated."""
    return BLOCK.sub(lambda m: f"{m.group(1)}{table(m.group('section'))}\n{m.group(4)}", text)


def sections(text: str) -> list[str]:
    return [m.group("section") for m in BLOCK.finditer(text)]


def main(argv: list[str]) -> int:
    for name in argv or ["docs/configuration.md"]:
        path = Path(name)
        path.write_text(render(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

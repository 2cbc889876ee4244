"""The configuration reference tables, generated from the parameter declarations.

docs/configuration.md holds blocks ``<!-- params: SECTION -->`` … ``<!-- /params -->``; each block is the
table of one section (``run``, ``data``, ``model``, ``privacy``, ``train``, ``defense:NAME``,
``attack:NAME``) rendered by :func:`table`. ``python -m dpeval.params_docs docs/configuration.md``
rewrites the blocks in place (after changing a declaration) and adds the section of a registered defense or
attack that has none (after the last section of its kind: a heading, its description, its table), so a new
plug-in's parameters are documented by running it; a test fails when the file is out of date.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from dpeval.core.files import write_text_atomic
from dpeval.core.params import params_table
from dpeval.core.settings import DataConfig, ModelConfig, PrivacyConfig, TrainConfig

BLOCK = re.compile(r"(<!-- params: (?P<section>[\w:-]+) -->\n)(?P<body>.*?)(<!-- /params -->)", re.S)
SETTINGS = {"data": DataConfig, "model": ModelConfig, "privacy": PrivacyConfig, "train": TrainConfig}


def table(section: str) -> str:
    """The markdown table of one section (see the module docstring)."""
    from dpeval.core.spec import RunSpec

    if section in SETTINGS:
        return params_table(SETTINGS[section], section)
    if section == "run":
        rows = params_table(RunSpec, "").split("\n")
        return "\n".join(rows[:2] + [r for r in rows[2:] if r.startswith(("| `seed`", "| `device`", "| `defaults`"))])
    kind, _, name = section.partition(":")
    if kind in (registries := _plugin_registries()):
        return params_table(registries[kind].get(name).Params, kind)
    raise KeyError(f"unknown params section {section!r}")


def render(text: str) -> str:
    """``text`` with every params block regenerated and the missing ones added (see the module docstring)."""
    text = BLOCK.sub(lambda m: f"{m.group(1)}{table(m.group('section'))}\n{m.group(4)}", text)
    for section in missing(text):
        text = add_section(text, section)
    return text


def sections(text: str) -> list[str]:
    return [m.group("section") for m in BLOCK.finditer(text)]


def missing(text: str) -> list[str]:
    """The ``defense:NAME`` / ``attack:NAME`` sections of registered plug-ins that ``text`` lacks."""
    have = set(sections(text))
    return [f"{kind}:{name}" for kind, registry in _plugin_registries().items() for name in registry.names()
            if f"{kind}:{name}" not in have]


def add_section(text: str, section: str) -> str:
    """``text`` with ``section`` added after the last block of its kind (at the end when there is none), in the
    file's style: a ``### `NAME` `` heading, the plug-in's description, its table."""
    kind, _, name = section.partition(":")
    description = _plugin_registries()[kind].describe()[name]
    block = f"### `{name}`\n\n{description}.\n\n<!-- params: {section} -->\n{table(section)}\n<!-- /params -->"
    ends = [m.end() for m in BLOCK.finditer(text) if m.group("section").startswith(f"{kind}:")]
    if not ends:
        return f"{text.rstrip()}\n\n{block}\n"
    return f"{text[:ends[-1]]}\n\n{block}{text[ends[-1]:]}"


def _plugin_registries() -> dict:
    from dpeval.attacks import ATTACKS
    from dpeval.defenses import DEFENSES

    return {"defense": DEFENSES, "attack": ATTACKS}


def main(argv: list[str]) -> int:
    for name in argv or ["docs/configuration.md"]:
        path = Path(name)
        write_text_atomic(path, render(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

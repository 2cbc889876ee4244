"""docs/configuration.md's tables are the parameter declarations: regenerating them changes nothing."""

from __future__ import annotations

from pathlib import Path

from attacks import ATTACKS
from defenses import DEFENSES
from harness.params_docs import render, sections, table

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_tables_match_the_code():
    text = DOC.read_text()
    assert render(text) == text, "docs/configuration.md is stale: run python -m harness.params_docs"


def test_every_section_has_a_table():
    have = set(sections(DOC.read_text()))
    want = {"run", "data", "model", "privacy", "train"} | {f"defense:{n}" for n in DEFENSES.names()} \
        | {f"attack:{n}" for n in ATTACKS.names()}
    assert want <= have, sorted(want - have)


def test_a_changed_declaration_shows_as_stale():
    text = DOC.read_text()
    stale = text.replace(table("train").split("\n")[2], "| `train.epochs` | int | `99` | >= 1 | old text |")
    assert stale != text and render(stale) == text

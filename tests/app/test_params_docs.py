"""docs/configuration.md's tables are the parameter declarations: regenerating them changes nothing."""

from __future__ import annotations

from pathlib import Path

from dpeval.attacks import ATTACKS
from dpeval.defenses import DEFENSES
from dpeval.params_docs import main, missing, render, sections, table
from tests.fixtures import registered

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_tables_match_the_code():
    text = DOC.read_text()
    assert missing(text) == [], "docs/configuration.md lacks sections: run python -m dpeval.params_docs"
    assert render(text) == text, "docs/configuration.md is stale: run python -m dpeval.params_docs"


def test_every_section_has_a_table():
    have = set(sections(DOC.read_text()))
    want = {"run", "data", "model", "privacy", "train"} | {f"defense:{n}" for n in DEFENSES.names()} \
        | {f"attack:{n}" for n in ATTACKS.names()}
    assert want <= have, sorted(want - have)


def test_a_changed_declaration_shows_as_stale():
    text = DOC.read_text()
    stale = text.replace(table("train").split("\n")[2], "| `train.epochs` | int | `99` | >= 1 | old text |")
    assert stale != text and render(stale) == text


def test_a_new_plugin_gets_its_section(tmp_path):
    """Regenerating the file adds a registered plug-in's missing section (heading, description, table) after the
    last one of its kind, and a second run changes nothing."""
    copy = tmp_path / "configuration.md"
    copy.write_text(DOC.read_text())
    with registered("plugin_defense", "plugin_attack"):
        assert missing(copy.read_text()) == ["defense:plugin-dpsgd", "attack:plugin-confidence"]
        assert main([str(copy)]) == 0
        text = copy.read_text()
        assert missing(text) == [] and render(text) == text
    defense = ("### `plugin-dpsgd`\n\nDP-SGD written as a one-file plug-in (docs/architecture.md).\n\n"
               "<!-- params: defense:plugin-dpsgd -->\n| key | type | default | allowed | meaning |\n"
               "|---|---|---|---|---|\n| `defense.clip` | float | `1.0` | > 0 | per-sample clipping norm C |\n"
               "<!-- /params -->")
    assert defense in text
    assert text.index("<!-- params: defense:rs -->") < text.index(defense) < text.index("## `attack`")
    start = text.index("### `plugin-confidence`")
    attack = text[start:text.index("<!-- /params -->", start) + len("<!-- /params -->")]
    assert text.index("<!-- params: attack:rmia -->") < start
    assert "| `attack.temperature` | float | `1.0` | > 0 | softmax temperature of the confidence score |" in attack
    assert text.replace(f"\n\n{defense}", "").replace(f"\n\n{attack}", "") == DOC.read_text()  # nothing else

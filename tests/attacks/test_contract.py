"""The declared attack contract, checked over every registered attack: parameters declared, headline
declared and reported, one end-to-end run with every attack at once on a small victim."""

from __future__ import annotations

import dataclasses
import math

import pytest

from dpeval.attacks import ATTACKS
from dpeval.attacks.base import AttackResult
from dpeval.config import build_spec
from dpeval.core.result_keys import AttackKey
from dpeval.core.verdicts import Verdict
from dpeval.runner import execute
from dpeval.store import ResultStore

NAMES = ATTACKS.names()
# Two targets of the reconstruction games (six, and 200 for informed-recon, by default): the run checks that every
# attack reports a headline and a verdict, not what the verdict is.
SMALL = {"ig_iterations": 30, "shadows": 4, "batches": 2, "batch_size": 1, "targets": 2}


@pytest.mark.parametrize("name", NAMES)
def test_declarations(name):
    cls = ATTACKS.get(name)
    assert cls.name == name
    assert cls.headline, f"attack {name} declares no headline metric"
    assert isinstance(cls.higher_leaks, bool)
    for f in dataclasses.fields(cls.Params):
        assert f.metadata.get("help"), f"attack {name}: parameter {f.name} has no help text"


@pytest.mark.parametrize("name", NAMES)
def test_one_hook_one_evidence_object(name):
    """Every attack implements the one hook, ``guess(evidence)``, typed with its family's evidence (frozen: the
    attack cannot write back into what the game hands it), and inherits its family's game."""
    import inspect
    import typing

    from dpeval.attacks.game import Game

    cls = ATTACKS.get(name)
    assert not inspect.isabstract(cls), f"{name}: {sorted(cls.__abstractmethods__)} not implemented"
    assert list(inspect.signature(cls.guess).parameters) == ["self", "evidence"]
    evidence = typing.get_type_hints(cls.guess)["evidence"]
    family = next(b for b in cls.__mro__ if "deal" in vars(b))
    assert family is not cls and cls.play is Game.play
    assert dataclasses.is_dataclass(evidence) and evidence.__dataclass_params__.frozen
    assert list(inspect.signature(cls.check_model).parameters) == ["params", "model", "shape"]


def test_an_attack_cannot_replace_its_familys_game():
    """Structural half of the attacker's boundary: the game (which holds the task) is the family's; a subclass
    that overrides ``play`` is refused when the class is made. Positive control: ``guess`` alone is accepted."""
    from dpeval.attacks.membership_game import VictimMembershipAttack

    class Fair(VictimMembershipAttack):
        def guess(self, evidence):
            return evidence

    assert Fair.play is VictimMembershipAttack.play
    with pytest.raises(TypeError, match="play is its family's game"):
        class Peeking(VictimMembershipAttack):
            def play(self, view, task):
                return task


def test_a_game_writes_no_file_the_application_writes_its_artefacts(tmp_path):
    """A game returns its artefacts as data; the runner's ``write_artefacts`` writes them under their names."""
    from dpeval.attacking import write_artefacts
    from tests.helpers import untrained_view

    spec = build_spec({"attacks": ["loss"], "device": "cpu"})
    view, task = untrained_view(spec, tmp_path / "loss")
    result = ATTACKS.get("loss")(spec.attack["loss"]).play(view, task)
    assert not any(view.out_dir.iterdir())
    written = write_artefacts(result.artefacts, view.out_dir)
    assert {k: p.name for k, p in written.items()} == {"roc": "roc.json", "roc_png": "roc.png", "scores": "scores.csv"}
    assert all(p.parent == view.out_dir and p.stat().st_size > 0 for p in written.values())


def test_an_attack_without_a_title_has_the_default_one():
    """``title()`` is read only after a game's models are trained: a shadow attack that gives none has the
    default, not an error then."""
    from dpeval.attacks.membership_game import ShadowAttack

    class Untitled(ShadowAttack):
        name = "untitled"

        def guess(self, evidence):
            return evidence

    assert Untitled(None).title() == "untitled attack"


@pytest.mark.parametrize("name", NAMES)
def test_headline_facts_read_from_the_source_are_the_imported_classs(name):
    """The leaderboard reads a built-in attack's headline facts from its source (no torch import): they must be
    what the class says once imported, inherited values included, or the source must not claim to tell them."""
    from dpeval.headlines import FACTS, _declared_facts

    declared = _declared_facts(name)
    assert declared is not None, f"{name}: its class body and Attack's must give every headline fact as a literal"
    cls = ATTACKS.get(name)
    assert dataclasses.astuple(declared) == tuple(getattr(cls, k) for k in FACTS)


def test_listing_results_of_built_in_attacks_imports_neither_attacks_nor_torch(tmp_path):
    """What each built-in attack's results read as (headline, direction, chance or baseline) in a fresh process,
    as the CLI's leaderboard starts: the same facts as above, and torch is never imported."""
    import json
    import subprocess
    import sys

    code = ("import json, sys\nfrom dpeval.headlines import attack_facts\n"
            "def read(a):\n    f = attack_facts(a)\n    return [f.headline, f.higher_leaks, f.chance_level()]\n"
            f"facts = {{a: read(a) for a in {NAMES!r}}}\n"
            "print(json.dumps({'facts': facts, 'torch': 'torch' in sys.modules}))")
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                    check=True).stdout)
    assert out["torch"] is False
    for name in NAMES:
        cls = ATTACKS.get(name)
        assert out["facts"][name][:2] == [cls.headline, cls.higher_leaks]
        assert out["facts"][name][-1] == (0.5 if cls.headline == "auc" and cls.chance is None else cls.chance)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return tmp_path_factory.mktemp("results")


@pytest.fixture(scope="module")
def every_attack(results):
    raw = {"attacks": NAMES, "train": {"epochs": 2}, "defense": {"name": "dpsgd"},
           "attack": {k: v for k, v in SMALL.items()}, "data": {"max_train": 400}}
    raw["attack"]["grad-mia"] = {"batch_size": 4}
    spec = build_spec(raw)
    return execute(spec, ResultStore(results), progress=False).flat()


@pytest.mark.slow
def test_every_attack_reports_its_headline_and_a_verdict_the_store_gives_back(every_attack, results):
    """One run of every attack (one test, so that the run is made once whichever worker takes it): each reports
    its headline metric as a finite float, and its AttackResult.verdict, stored as its text under
    leakage.<attack>.verdict, reads back as the same Verdict."""
    stored_metrics = ResultStore(results).get(every_attack["run_id"])["metrics"]
    for name in NAMES:
        value = every_attack[f"leakage.{name}.{ATTACKS.get(name).headline}"]
        assert isinstance(value, float) and math.isfinite(value), name
        key = str(AttackKey.verdict(name))
        reported = every_attack[key]
        stored = stored_metrics[key]
        assert type(reported) is str and Verdict.parse(reported) in Verdict, name
        assert stored == reported and Verdict.parse(stored) is Verdict.parse(reported), name


def test_a_verdict_is_reported_typed_never_among_the_metrics():
    assert AttackResult({"auc": 0.5}, verdict="leaks").verdict is Verdict.LEAKS
    assert AttackResult({"auc": 0.5}).verdict is None  # an attack without a rule
    with pytest.raises(ValueError, match="AttackResult.verdict"):
        AttackResult({"auc": 0.5, "verdict": Verdict.LEAKS})
    with pytest.raises(ValueError):
        AttackResult({"auc": 0.5}, verdict="leak")


def test_per_state_metrics_are_reported_as_a_mapping_never_as_dotted_names():
    result = AttackResult({"psnr": 9.0}, states={"epoch:2": {"psnr": 8.0}, "final": {"psnr": 9.0}})
    assert result.states["epoch:2"] == {"psnr": 8.0}
    with pytest.raises(ValueError, match="AttackResult.states"):
        AttackResult({"psnr": 9.0, "final.psnr": 9.0})
    with pytest.raises(ValueError, match="request"):
        AttackResult({"psnr": 9.0}, states={"trajectory:3": {"psnr": 9.0}})
    with pytest.raises(ValueError, match="model state"):
        AttackResult({"psnr": 9.0}, states={"middle": {"psnr": 9.0}})
    assert AttackResult({"tpr_at_0.1pct_fpr": 0.0}).metrics  # a dot inside a metric's name is no state

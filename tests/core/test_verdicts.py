"""The verdict type: the stored text of every verdict, parsing it back, and its merge over seeds."""

import json

import pytest

from dpeval.core.verdicts import BoundCheck, Mixed, Verdict


def test_values_are_the_stored_text():
    assert [v.value for v in Verdict] == ["leaks", "no-leak-detected"]
    assert f"{Verdict.NO_LEAK}" == str(Verdict.NO_LEAK) == "no-leak-detected"
    assert json.dumps({"v": Verdict.LEAKS}) == '{"v": "leaks"}'
    assert Verdict.LEAKS.leaks and not Verdict.NO_LEAK.leaks
    assert Verdict.of(True) is Verdict.LEAKS and Verdict.of(False) is Verdict.NO_LEAK


def test_a_bound_checks_values_are_the_stored_text_and_no_run_verdict():
    """``audit.verdict`` and ``bound_check`` store PASS / FAIL, as they always did; neither reads as a leak verdict."""
    assert [v.value for v in BoundCheck] == ["PASS", "FAIL"]
    assert BoundCheck.of(True) is BoundCheck.PASS and BoundCheck.of(False) is BoundCheck.FAIL
    assert BoundCheck.PASS.passed and not BoundCheck.FAIL.passed
    assert type(BoundCheck.of(True).value) is str and json.dumps({"v": BoundCheck.FAIL}) == '{"v": "FAIL"}'
    with pytest.raises(ValueError):
        Verdict.parse("PASS")


def test_parse_reads_back_a_run_a_group_or_no_verdict():
    assert Verdict.parse("leaks") is Verdict.LEAKS and Verdict.parse("no-leak-detected") is Verdict.NO_LEAK
    assert Verdict.parse(None) is None
    assert Verdict.parse("mixed (1/3 leak)") == Mixed(1, 3) and str(Mixed(1, 3)) == "mixed (1/3 leak)"
    for wrong in ("Leaks", "leak", "mixed", "mixed (1/3)", 1, ["leaks"]):
        with pytest.raises(ValueError, match="not a verdict"):
            Verdict.parse(wrong)


def test_merge_over_seeds():
    assert Verdict.merge(["leaks", "leaks"]) is Verdict.LEAKS
    assert Verdict.merge([Verdict.NO_LEAK, "no-leak-detected"]) is Verdict.NO_LEAK
    assert Verdict.merge(["leaks", "no-leak-detected", "no-leak-detected"]) == Mixed(1, 3)
    assert Verdict.merge(["no-leak-detected", None]) == Mixed(0, 2)  # a seed without a verdict disagrees
    assert Verdict.merge([None, None]) is None
    assert Mixed(1, 3).leaks and Mixed(0, 2).leaks  # disagreeing seeds read as leakage some seed shows

"""Contracts of the commands under hostile input: what is refused is refused before any work (exit 2, nothing
written), and what is accepted runs to the end.

- ``audit --scope run``: every accepted ``--canaries`` is split into guesses that fit (k+ + k− ≤ m, = m for the
  rule that guesses on every canary); an unusable one is refused before training.
"""

import json

import pytest
from click.testing import CliRunner

from dpeval.audit import run as run_audit
from dpeval.audit.run import GUESS_RULES, guess_counts
from dpeval.cli import main

# ---------------------------------------------------------------------------------------------------
# audit --scope run: the canaries' guessing rules


@pytest.mark.parametrize("m", [2, 3, 4, 5, 6, 7, 10, 11, 15, 19, 99, 101, 1001, 1003])
def test_every_guessing_rule_fits_the_canaries(m):
    """Each rule guesses on at least one and at most m canaries, close to its fractions of m; the rule that
    guesses on every canary (half in, half out) makes exactly m guesses, also for m ≡ 3 (mod 4) where rounding
    each half on its own made m + 1."""
    for (f_in, f_out), (k_in, k_out) in zip(GUESS_RULES, guess_counts(m)):
        assert 1 <= k_in + k_out <= m and k_in >= 0 and k_out >= 0, (m, f_in, f_out, k_in, k_out)
        assert abs(k_in - f_in * m) <= 1 and abs(k_out - f_out * m) <= 1, (m, f_in, f_out, k_in, k_out)
        if f_in + f_out == 1:
            assert k_in + k_out == m


def test_every_canary_count_up_to_a_thousand_splits():
    for m in range(2, 1001):
        assert all(k_in + k_out <= m for k_in, k_out in guess_counts(m)), m


def invoke(*args):
    return CliRunner().invoke(main, list(args))


@pytest.mark.timeout(300)
def test_a_run_audit_with_three_canaries_finishes():
    """End to end at the smallest settings: m = 3 trained to the end and then crashed on 2 + 2 guesses."""
    result = invoke("audit", "--defense", "dpsgd", "--scope", "run", "--canaries", "3", "--quiet", "--json",
                    "--set", "train.epochs=1")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["audit.canaries"] == 3 and data["audit.guesses"] <= 3
    assert all(t["guesses"] <= 3 for t in data["audit.tests"])


@pytest.mark.parametrize("args", [["--canaries", "1"], ["--canaries", "0"], ["--canaries", "-4"],
                                  ["--canaries", "100000"], ["--canaries", "1", "--canary-kind", "input"],
                                  ["--canaries", "100000000", "--canary-kind", "input"]])
def test_unusable_canaries_are_refused_before_training(args, monkeypatch):
    """Fewer than two, more gradient canaries than trainable parameters, more input canaries than private
    examples (10⁸ noise images: a memory error with a traceback before)."""
    def no_training(*a, **k):
        raise AssertionError("trained before refusing --canaries")

    monkeypatch.setattr(run_audit, "train", no_training)
    result = invoke("audit", "--defense", "dpsgd", "--scope", "run", "--quiet", *args)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("dpeval: error: --canaries: ") and "Traceback" not in result.output

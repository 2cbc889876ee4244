"""``dpeval audit``: every DP defense passes with a tight canary and is caught without its noise, deliberately
broken defenses (subclasses of the real ones, defined here) are caught with ε_LB > ε, and the bound machinery
and CLI behave."""

import json
import math

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from dpeval.audit import driver as audit_mod
from dpeval.audit.driver import AuditOptions, dp_defense_names, run_audit
from dpeval.audit.format import format_audit
from dpeval.cli import main
from dpeval.config import build_spec
from dpeval.core.runtime import single_cpu_thread
from dpeval.core.statistics import split_bound
from dpeval.core.streams import Streams
from dpeval.defenses import DEFENSES
from dpeval.defenses.adaclip import AdaCliP
from dpeval.defenses.base import SharedGradient
from dpeval.defenses.dpsgd import DPSGD
from dpeval.defenses.gep import GEP
from dpeval.defenses.rs import RandomSparsification
from tests.helpers import noiseless

MU = math.sqrt(audit_mod.DEFAULT_STEPS) / audit_mod.DEFAULT_NOISE_MULTIPLIER  # accountant's μ of the audit


def audit(name, trials, defense_cls=None, seed=0, **settings):
    raw = {"defense": {"name": name, **settings}, "seed": seed}
    return run_audit(build_spec(raw), AuditOptions(trials=trials), defense_cls=defense_cls)


def by_name(result):
    return {t["name"]: t for t in result["audit.tests"]}


# ---------------------------------------------------------------------------------------------------
# every registered DP defense passes, with a canary that reaches the accountant's μ


def test_the_dp_registry_is_what_the_audit_covers():
    names = dp_defense_names()
    assert {"dpsgd", "rs", "random-freeze", "gep", "adaclip"} <= set(names)
    assert "none" not in names


@pytest.mark.parametrize("name", dp_defense_names())
def test_every_dp_defense_passes_with_a_worst_case_canary(name):
    result = audit(name, trials=5000)
    assert result["audit.passed"], result
    assert result["audit.epsilon_lower_bound"] <= result["privacy.epsilon"]
    assert result["privacy.epsilon"] == pytest.approx(3.19, abs=0.01)  # σ = 2, 2 steps, δ = 1e-5
    tests = by_name(result)
    main_test = tests["kept/projection"] if "kept/projection" in tests else tests["released/projection"]
    # The projection statistic's standardised shift is the mechanism's μ: the canary carries the full
    # sensitivity and the noise is exactly as accounted (a weaker canary or a different noise would move it).
    assert main_test["separation"] == pytest.approx(MU, abs=0.1)
    assert main_test["epsilon_lower_bound"] > 0  # the canary is visible at all
    assert main_test["trials_per_neighbour"] >= 5000
    if "masked/projection" in tests:  # RS / random freeze: masked coordinates release nothing
        assert tests["masked/projection"]["epsilon_lower_bound"] == 0
        assert tests["masked/projection"]["separation"] == 0


@pytest.mark.parametrize("name", dp_defense_names())
def test_every_dp_defense_without_its_noise_fails(name):
    """Positive control of the test above, at its settings: every Gaussian draw zeroed, the ledger unchanged."""
    result = audit(name, trials=5000, defense_cls=noiseless(DEFENSES.get(name)))
    assert result["audit.epsilon_lower_bound"] > 1.5 * result["privacy.epsilon"], format_failure(result)
    assert not result["audit.passed"] and result["audit.verdict"] == "FAIL"


def test_ranked_rs_passes_although_its_mask_follows_the_releases():
    """Ranked masks depend on earlier (noisy) releases: post-processing, so the mask statistic stays
    within ε; the same run with the clean gradient in the ranking is caught below."""
    result = audit("rs", trials=5000, mask="ranked")
    assert result["audit.passed"]
    tests = by_name(result)
    assert tests["kept/projection"]["separation"] == pytest.approx(MU, abs=0.1)
    assert tests["kept/mask"]["epsilon_lower_bound"] < result["privacy.epsilon"]


def test_groupwise_layer_groups_get_a_canary_in_every_group():
    """With per-layer groups each group is clipped to R/√M: a canary in one group would reach only μ/√M."""
    result = audit("groupwise", trials=5000, groups="layer")
    assert result["audit.passed"]
    assert by_name(result)["released/projection"]["separation"] == pytest.approx(MU, abs=0.1)


# ---------------------------------------------------------------------------------------------------
# broken defenses are caught


class HalvedNoiseDPSGD(DPSGD):
    """Bug: adds half the noise it reports (and the accountant is told)."""

    def release(self, batch_size):
        std = self.noise_multiplier * self.params.clip
        grads = {n: (s + self.gaussian(s.shape, std / 2)) / batch_size for n, s in self._sum.items()}
        self.reset()
        return SharedGradient(grads, batch_size=batch_size, noise_std=std / batch_size)


class NoiseBeforeClippingDPSGD(DPSGD):
    """Bug: the noise goes on each per-sample gradient before clipping, so clipping bounds it away."""

    def clip_and_accumulate(self, grads):
        std = self.noise_multiplier * self.params.clip
        super().clip_and_accumulate({n: g + self.gaussian(g.shape, std) for n, g in grads.items()})

    def release(self, batch_size):
        grads = {n: s / batch_size for n, s in self._sum.items()}
        self.reset()
        return SharedGradient(grads, batch_size=batch_size,
                              noise_std=self.noise_multiplier * self.params.clip / batch_size)


class CleanStatisticsAdaCliP(AdaCliP):
    """Bug: the public statistics (m, s²) are updated from the clean gradient instead of the release."""

    def release(self, batch_size):
        self._clean = {n: self.b[n] * (s / batch_size) + self.m[n] for n, s in self._sum.items()}
        return super().release(batch_size)

    def update_statistics(self, released, batch_size):
        super().update_statistics(self._clean, batch_size)


class PrivateAnchorsGEP(GEP):
    """Bug: the anchor subspace is computed from the private batch instead of public data."""

    def clip_and_accumulate(self, grads):
        rows = self.flatten(grads)
        self.bases = self.compute_bases(lambda: iter([rows]), rows.shape[0])
        self.bases_step = self.step
        super().clip_and_accumulate(grads)


class UnmaskedSumRS(RandomSparsification):
    """Bug: per-sample gradients are clipped and summed without the mask (noise only on kept coordinates),
    so masked coordinates are released noise-free."""

    def clip_and_accumulate(self, grads):
        keep = self.keep
        self.keep = torch.ones_like(keep)
        try:
            super().clip_and_accumulate(grads)
        finally:
            self.keep = keep


class CleanRankingRS(RandomSparsification):
    """Bug: ranked masks rank coordinates by the clean (un-noised) gradient: a data-dependent mask."""

    def release(self, batch_size):
        clean = torch.cat([self._sum[n].reshape(-1) for n in self.param_shapes]) / batch_size
        ranking = None if self.ranking_sum is None else self.ranking_sum.clone()
        shared = super().release(batch_size)
        if ranking is not None:
            self.ranking_sum = ranking + clean
        return shared


def test_halved_noise_is_caught_where_the_real_dpsgd_passes():
    """Factor-2 under-noising (μ = 1 per step instead of 0.5) at the default trial count."""
    trials = audit_mod.DEFAULT_TRIALS
    real = audit("dpsgd", trials)
    broken = audit("dpsgd", trials, HalvedNoiseDPSGD)
    assert real["audit.passed"] and real["audit.epsilon_lower_bound"] < real["privacy.epsilon"] - 1
    assert broken["audit.epsilon_lower_bound"] > broken["privacy.epsilon"], broken
    assert not broken["audit.passed"] and broken["audit.verdict"] == "FAIL"
    assert by_name(broken)["released/projection"]["separation"] == pytest.approx(2 * MU, abs=0.1)


@pytest.mark.parametrize("name,broken,statistic,settings", [
    ("dpsgd", NoiseBeforeClippingDPSGD, "released/projection", {}),
    ("adaclip", CleanStatisticsAdaCliP, "released/state", {}),
    ("gep", PrivateAnchorsGEP, "released/anchors", {}),
    ("rs", UnmaskedSumRS, "masked/projection", {}),
    ("rs", CleanRankingRS, "kept/mask", {"mask": "ranked"}),
])
def test_noise_free_leaks_are_caught(name, broken, statistic, settings):
    result = audit(name, trials=2000, defense_cls=broken, **settings)
    assert result["audit.epsilon_lower_bound"] > result["privacy.epsilon"], format_failure(result)
    assert not result["audit.passed"]
    assert result["audit.statistic"] == statistic


def format_failure(result):
    return format_audit(result)


# ---------------------------------------------------------------------------------------------------
# the bound and the canaries


def test_split_bound_of_perfectly_separated_scores_is_the_clopper_pearson_limit():
    releases, k, delta, alpha = 40, 100, 1e-5, 0.05
    labels = np.zeros((releases, k), dtype=bool)
    labels[:, :50] = True
    scores = labels.astype(float) + 0.01 * np.random.default_rng(0).standard_normal((releases, k))
    out = split_bound(scores, labels, delta, alpha)
    n = releases // 2 * 50  # judged members (= non-members)
    tpr_lo = (alpha / 2) ** (1 / n)  # Clopper–Pearson ends for n of n and 0 of n
    expected = math.log((tpr_lo - delta) / (1 - tpr_lo))
    assert out["epsilon_lower_bound"] == pytest.approx(expected, rel=1e-9)
    assert out["tpr"] == 1 and out["fpr"] == 0


def test_split_bound_of_indistinguishable_scores_is_near_zero():
    rng = np.random.default_rng(1)
    labels = rng.random((40, 250)) < 0.5
    out = split_bound(rng.standard_normal((40, 250)), labels, 1e-5, 0.05)
    assert out["epsilon_lower_bound"] < 0.2


def test_split_bound_matches_the_gaussian_mechanism():
    """Gaussian scores with shift μ: every ε_LB stays below the exact ε of the μ-GDP mechanism at δ (valid),
    and on average reaches most of it with 10⁴ judged trials per class (powerful)."""
    from scipy import optimize, stats

    mu, delta = 1.0, 1e-3

    def gdp_delta(eps):  # Balle & Wang: δ(ε) of the Gaussian mechanism with sensitivity/σ = μ
        return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)

    exact = optimize.brentq(lambda e: gdp_delta(e) - delta, 0, 20)
    bounds = []
    for seed in range(5):
        rng = np.random.default_rng(seed)
        labels = np.zeros((200, 200), dtype=bool)
        labels[:, :100] = True
        scores = rng.standard_normal(labels.shape) + mu * labels
        bounds.append(split_bound(scores, labels, delta, 0.05)["epsilon_lower_bound"])
    assert max(bounds) < exact
    assert np.mean(bounds) > 0.55 * exact, (bounds, exact)


def test_gep_canaries_fill_embedding_and_residual_orthogonally():
    ctx = audit_mod.prepare_audit(build_spec({"defense": "gep"}), AuditOptions())
    defense = ctx.make_defense(Streams(3).scope("audit", "probe"))
    design = type(defense).audit_design()
    canaries = design.design(defense, "released", 64, torch.Generator().manual_seed(0), None)
    u = canaries.dense
    torch.testing.assert_close(u @ u.T, torch.eye(64), atol=1e-4, rtol=0)
    span, resid = canaries.parts["embedding"], canaries.parts["residual"]
    embed = defense.embed(span)  # unit vectors of the public subspace: norm 1 after projection
    torch.testing.assert_close(embed.norm(dim=1), torch.ones(64), atol=1e-4, rtol=0)
    assert defense.embed(resid).abs().max() < 1e-4  # the residual part is orthogonal to every basis


def test_canaries_in_one_release_are_independent_trials():
    """Scores of the out-canaries of one release share no common component: the variance of their
    per-release mean is the per-canary variance / count (as for independent trials)."""
    ctx = audit_mod.prepare_audit(build_spec({"defense": "dpsgd"}), AuditOptions())
    design = ctx.defense_cls.audit_design()
    with single_cpu_thread(torch.device("cpu")):
        scores, labels = audit_mod.audit_variant(ctx, design, "released", AuditOptions(trials=10240),
                                                 Streams(0).scope("audit", "released"))
    out = np.where(labels, np.nan, scores["projection"])
    per_release = np.nanmean(out, axis=1)
    ratio = per_release.var(ddof=1) * (~labels).sum(axis=1).mean() / np.nanvar(out)
    assert 0.4 < ratio < 2.0, ratio


def test_one_canary_per_release_gives_the_same_separation():
    result = run_audit(build_spec({"defense": "dpsgd"}), AuditOptions(trials=600, canaries=1))
    test = by_name(result)["released/projection"]
    assert test["canaries"] == 1 and test["releases"] == 1200
    assert test["separation"] == pytest.approx(MU, abs=0.2)
    assert result["audit.passed"]


# ---------------------------------------------------------------------------------------------------
# CLI


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_cli_audit_rs_passes_and_prints_both_numbers():
    result = invoke("audit", "--defense", "rs")
    assert result.exit_code == 0, result.output
    assert "ε_LB = " in result.stdout and " ε = 3.189" in result.stdout
    assert "PASS" in result.stdout and "kept/projection" in result.stdout and "masked/projection" in result.stdout
    assert "trials per neighbour" in result.stdout


def test_cli_json_keys():
    result = invoke("audit", "--defense", "adaclip", "--trials", "2000", "--seed", "3", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for key in ("audit.epsilon_lower_bound", "privacy.epsilon", "privacy.delta", "privacy.noise_multiplier",
                "privacy.accounted_noise_multiplier", "privacy.steps", "audit.trials", "audit.statistic",
                "audit.verdict", "audit.passed", "audit.tests", "defense", "defense.clip", "seed"):
        assert key in data, key
    assert data["seed"] == 3 and data["audit.verdict"] == "PASS" and data["audit.trials"] >= 2000
    assert data["privacy.noise_multiplier"] == audit_mod.DEFAULT_NOISE_MULTIPLIER
    assert {t["name"] for t in data["audit.tests"]} == {"released/projection", "released/state"}


def test_cli_help_states_the_defaults():
    text = " ".join(invoke("audit", "--help").stdout.split())
    for value in (audit_mod.DEFAULT_TRIALS, audit_mod.DEFAULT_NOISE_MULTIPLIER, audit_mod.DEFAULT_STEPS,
                  audit_mod.DEFAULT_CANARIES):
        assert f"default {value}" in text, value


def test_cli_exit_1_on_a_failed_audit():
    """A (broken) plug-in defense registered under its own name is audited like the built-in ones."""
    broken = type("RegisteredNoiseBeforeClippingDPSGD", (NoiseBeforeClippingDPSGD,), {})
    DEFENSES.register("dpsgd-broken", "test plug-in: noise before clipping")(broken)
    try:
        result = invoke("audit", "--defense", "dpsgd-broken", "--trials", "1000")
    finally:
        DEFENSES.unregister("dpsgd-broken")
    assert "dpsgd-broken" not in DEFENSES
    assert result.exit_code == 1
    assert "FAIL" in result.stdout and "audit failed" in result.stderr


@pytest.mark.parametrize("args,field", [
    (["--defense", "nope"], "unknown defense 'nope'"),
    (["--defense", "none"], "not a DP mechanism"),
    (["--defense", "rs", "--set", "defense.clip=null", "--set", "defense.noise_std=0.1"], "not a DP mechanism"),
    (["--defense", "rs", "--set", "defense.final_rate=2"], "defense.final_rate"),
    (["--defense", "rs", "--set", "defense.bogus=1"], "defense.bogus"),
    (["--defense", "rs", "--set", "noequals"], "--set"),
    (["--defense", "dpsgd", "--set", "privacy.epsilon=2"], "privacy.epsilon"),
    (["--defense", "dpsgd", "--trials", "1"], "--trials"),
    (["--defense", "dpsgd", "--steps", "0"], "--steps"),
    (["--defense", "dpsgd", "--steps", "5", "--set", "train.epochs=3"], "--steps"),
    (["--defense", "dpsgd", "--noise-multiplier", "0"], "--noise-multiplier"),
    (["--defense", "dpsgd", "--canaries", "0"], "--canaries"),
])
def test_cli_bad_input_exits_2_with_one_line(args, field):
    result = invoke("audit", *args)
    assert result.exit_code == 2, result.output
    assert field in result.stderr
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1

"""``dpeval audit --scope run``: every built-in DP defense passes a one-run audit of a whole (small) training
and fails it with its noise planted out, and four planted run-level bugs — invisible to the per-release
audit, which passes each of them — are caught (ε_LB > the run's accounted ε), each beside the real defense
at the same settings, which passes.

The bugs are planted like the per-release audit's: subclasses of the real defenses (and, for the sampling
bug, a privacy planner) handed to the audit in place of the registry's."""

import json
import math

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from dpeval.audit.driver import AuditOptions, dp_defense_names, run_audit
from dpeval.audit.run import STATISTICS, RunAuditOptions, canary_scores, run_scope_audit
from dpeval.cli import main
from dpeval.config import build_spec
from dpeval.core.accounting import default_delta, noise_for
from dpeval.core.ledger import PrivacyLedger
from dpeval.core.one_run_bounds import GUESS_RULES
from dpeval.defenses import DEFENSES
from dpeval.defenses.base import SharedGradient
from dpeval.defenses.clipping import clip_factors
from dpeval.defenses.dpsgd import DPSGD
from dpeval.defenses.rs import RandomSparsification
from dpeval.victims import plan_privacy
from tests.helpers import noiseless


def spec(name, seed=0, **sections):
    raw = {"defense": {"name": name, **sections.pop("defense", {})}, "seed": seed}
    raw.update(sections)
    return build_spec(raw)


def audit_run(name, defense_cls=None, plan=None, canaries=1000, **sections):
    return run_scope_audit(spec(name, **sections), RunAuditOptions(canaries=canaries), defense_cls=defense_cls,
                           plan=plan)


def audit_release(name, defense_cls=None, **sections):
    """The per-release audit at its defaults (10⁵ trials per neighbour), on the same settings."""
    sections.pop("privacy", None)  # the release audit runs at its own σ
    return run_audit(spec(name, **sections), AuditOptions(), defense_cls=defense_cls)


# ---------------------------------------------------------------------------------------------------
# every built-in DP defense passes


# At a claimed ε = 1: 400 canaries cannot show much more than ε_LB ≈ 2.9 even without any noise, so at the
# default ε = 3 a pass would be certain and prove nothing (the control below).
SMALL = {"train": {"epochs": 4}, "privacy": {"epsilon": 1.0}}


@pytest.mark.parametrize("name", dp_defense_names())
def test_every_dp_defense_passes_the_whole_run_audit(name):
    result = audit_run(name, canaries=400, **SMALL)
    assert result["audit.passed"] and result["audit.verdict"] == "PASS", result
    assert 0 <= result["audit.epsilon_lower_bound"] <= result["privacy.epsilon"]
    assert result["audit.scope"] == "run"
    # the counting and the f-DP analyses judge every (statistic, rule); the Gaussian pair models ``sum``
    assert len(result["audit.tests"]) == 2 * len(STATISTICS) * len(GUESS_RULES)
    assert set(result["audit.bounds"]) == {"counting", "f-dp", "gaussian-pair"}
    assert result["audit.estimator"] in result["audit.bounds"]
    assert all(b["epsilon_lower_bound"] <= result["privacy.epsilon"] for b in result["audit.bounds"].values())
    assert result["audit.canaries_included"] == pytest.approx(200, abs=45)  # each in with probability 1/2
    # included canaries were sampled like pool members: ≈ q per step, i.e. ≈ once per epoch
    assert result["audit.mean_samplings_included"] == pytest.approx(4, rel=0.25)


@pytest.mark.parametrize("name", dp_defense_names())
def test_every_dp_defense_without_its_noise_fails_the_whole_run_audit(name):
    """Positive control of the test above, at its settings: the defense with every Gaussian draw zeroed (its
    ledger still claiming ε = 1) is caught (measured ε_LB 2.4–2.9)."""
    result = audit_run(name, defense_cls=noiseless(DEFENSES.get(name)), canaries=400, **SMALL)
    assert result["privacy.epsilon"] == pytest.approx(1.0, abs=0.01)
    assert result["audit.epsilon_lower_bound"] > 2 * result["privacy.epsilon"], result
    assert not result["audit.passed"] and result["audit.verdict"] == "FAIL"


class TenthNoiseDPSGD(DPSGD):
    """Bug: a tenth of the noise the ledger plans (every Gaussian draw scaled by 0.1, σ reported unchanged)."""

    def standard_normal(self, shape):
        return 0.1 * super().standard_normal(shape)


def test_a_tenth_of_the_noise_fails_under_every_estimator_and_no_noise_reaches_the_ceilings():
    """The planted σ/10 DP-SGD run fails under the counting, the f-DP and the Gaussian-pair analysis alike. With no
    noise at all every "in" guess of ``sum`` is right (the included canaries are the only nonzero scores), so the
    guessing estimators reach their ceiling for those guesses: the bound of r right of r. ("Out" guesses cannot all be
    right: an included canary that was never sampled scores 0, like an excluded one.)"""
    from dpeval.core.one_run_bounds import fdp_mu_lower_bound, gdp_epsilon
    from dpeval.core.statistics import one_run_epsilon_lower_bound

    under = audit_run("dpsgd", defense_cls=TenthNoiseDPSGD, canaries=400, **SMALL)
    assert not under["audit.passed"]
    for name, bound in under["audit.bounds"].items():
        assert bound["epsilon_lower_bound"] > under["privacy.epsilon"], (name, bound)
    free = audit_run("dpsgd", defense_cls=noiseless(DPSGD), canaries=400, **SMALL)
    in_only = [t for t in free["audit.tests"] if t["statistic"] == "sum" and t["k_out"] == 0]
    assert in_only and all(t["correct"] == t["k_in"] for t in in_only)
    m, delta, level = 400, free["privacy.delta"], 0.05 / 3 / 30
    r = max(t["k_in"] for t in in_only)
    assert free["audit.bounds"]["counting"]["epsilon_lower_bound"] >= one_run_epsilon_lower_bound(r, r, m, delta, level)
    assert free["audit.bounds"]["f-dp"]["epsilon_lower_bound"] >= gdp_epsilon(fdp_mu_lower_bound(r, r, m, level), delta)


# ---------------------------------------------------------------------------------------------------
# planted run-level bugs


class ReusedNoiseDPSGD(DPSGD):
    """Bug: the noise generator is re-seeded to the same state before every release, so every step adds the
    same noise vector (it cancels in differences of releases)."""

    def release(self, batch_size):
        if not hasattr(self, "_first_state"):
            self._first_state = self.generator.get_state()
        self.generator.set_state(self._first_state)
        return super().release(batch_size)


class LateNoiseDropDPSGD(DPSGD):
    """Bug: a step-count schedule drops the noise for the last two epochs' releases (still reporting the
    accounted noise std)."""

    releases = 0
    epochs_total = 1

    def begin_epoch(self, epoch, epochs):
        self.epochs_total = epochs
        super().begin_epoch(epoch, epochs)

    def release(self, batch_size):
        self.releases += 1
        if self.releases > self.steps_per_epoch * (self.epochs_total - 2):
            std = self.noise_multiplier * self._clipping.sensitivity
            grads = {n: s / batch_size for n, s in self._sum.items()}
            self.reset()
            return SharedGradient(grads, batch_size=batch_size, noise_std=std / batch_size)
        return super().release(batch_size)


class WarmupSaliencyRS(RandomSparsification):
    """Bug: from epoch 1 on, the mask keeps the coordinates with the largest clipped per-sample gradient
    entry seen during (dense) epoch 0, instead of a random set: a mask derived from the private data."""

    saliency = None

    def clip_and_accumulate(self, grads):
        if self.epoch == 0:
            flat = torch.cat([g.reshape(g.shape[0], -1) for g in grads.values()], dim=1)
            top = (flat.abs() * clip_factors(flat.norm(dim=1), self.params.clip)[:, None]).max(dim=0).values
            self.saliency = top if self.saliency is None else torch.maximum(self.saliency, top)
        super().clip_and_accumulate(grads)

    def _new_mask(self, period):
        super()._new_mask(period)
        if self.epoch >= 1 and self.saliency is not None:
            keep = torch.ones(self.d, dtype=torch.bool)
            keep[torch.argsort(self.saliency.cpu(), stable=True)[:math.floor(self.rate * self.d)]] = False
            self.keep = keep.to(self.device)


def per_example_rate_plan(spec, defense_cls, n):
    """Bug: shuffled batches accounted as Poisson sampling with q = 1/N (the rate of one example per step)
    instead of B/N: the ledger records the wrong q, so σ is calibrated for it, far too small for the target ε."""
    p, t = spec.privacy, spec.train
    steps = t.epochs * (n // t.batch_size)
    delta = p.delta if p.delta is not None else default_delta(n)
    sigma = noise_for(p.epsilon, delta, 1 / n, steps, p.accountant)
    return PrivacyLedger(sigma, sigma, 1 / n, steps, delta, p.accountant, t.sampling)


BUGS = {
    # bug: (defense, broken class, privacy planner, settings, statistic that catches it)
    "noise reused between steps": ("dpsgd", ReusedNoiseDPSGD, None, {"train": {"epochs": 8}}, "roughness"),
    "σ dropped in the last epochs": ("dpsgd", LateNoiseDropDPSGD, None, {"train": {"epochs": 8}}, "roughness"),
    "RS mask from epoch-0 data": ("rs", WarmupSaliencyRS, None,
                                  {"defense": {"final_rate": 0.98}, "train": {"epochs": 5, "engine": "func"}}, "mask"),
    "shuffle accounted with q = 1/N": ("dpsgd", None, per_example_rate_plan, {"train": {"sampling": "shuffle"}}, "sum"),
}


@pytest.mark.slow
@pytest.mark.parametrize("bug", list(BUGS))
def test_planted_run_level_bug_is_caught_where_the_release_audit_passes(bug):
    name, broken, plan, settings, statistic = BUGS[bug]
    settings = {**settings, "privacy": {"epsilon": 1.0}}
    real = audit_run(name, **settings)
    caught = audit_run(name, defense_cls=broken, plan=plan, **settings)
    assert real["audit.passed"], real
    assert caught["privacy.epsilon"] == pytest.approx(1.0, abs=0.01)  # the run claims ε = 1 either way
    assert caught["audit.epsilon_lower_bound"] > 1.5 * caught["privacy.epsilon"], caught
    assert not caught["audit.passed"] and caught["audit.verdict"] == "FAIL"
    assert caught["audit.statistic"] == statistic
    assert real["audit.epsilon_lower_bound"] < caught["audit.epsilon_lower_bound"] - 1
    release = audit_release(name, defense_cls=broken, **settings)
    assert release["audit.passed"], release  # the per-release audit does not see it


def test_the_sampling_bug_is_a_bug_of_the_plan_not_of_shuffling():
    """The same shuffled run, correctly planned (σ for q = B/N), passes; the planted plan's σ is far smaller."""
    buggy = per_example_rate_plan(spec("dpsgd", train={"sampling": "shuffle"}, privacy={"epsilon": 1.0}),
                                  DPSGD, 1258)
    right = plan_privacy(spec("dpsgd", train={"sampling": "shuffle"}, privacy={"epsilon": 1.0}), DPSGD, 1258)
    assert buggy.noise_multiplier < right.noise_multiplier / 2


# ---------------------------------------------------------------------------------------------------
# the statistics


def test_scores_separate_what_each_statistic_is_for():
    """Synthetic releases: fresh noise + one canary (index 0) sampled at steps 3 and 7."""
    rng = np.random.default_rng(0)
    steps, m = 20, 50
    fresh = rng.standard_normal((steps, m))
    fresh[[3, 7], 0] += 3
    reused = np.tile(rng.standard_normal(m), (steps, 1))
    reused[[3, 7], 0] += 1
    shown = np.ones((steps, m), dtype=bool)
    assert np.argmax(canary_scores(fresh, shown)["sum"]) == 0
    assert np.argmax(canary_scores(reused, shown)["roughness"]) == 0  # noise identical in every step
    masks = shown.copy()
    masks[:, 1:] = rng.random((steps, m - 1)) < 0.5
    assert np.argmax(canary_scores(fresh, masks)["mask"]) == 0
    quiet = fresh.copy()
    quiet[15:] = 0.01 * rng.standard_normal((5, m))  # the last steps without noise
    quiet[16, 0] += 1
    assert np.argmax(canary_scores(quiet, shown)["sum"]) == 0  # weighted by the measured spread


# ---------------------------------------------------------------------------------------------------
# CLI


def invoke(*args):
    return CliRunner().invoke(main, list(args))


def test_cli_run_scope_passes_and_reports_the_bound_guesses_and_design():
    result = invoke("audit", "--defense", "dpsgd", "--scope", "run", "--quiet", "--set", "train.epochs=3",
                    "--canaries", "300")
    assert result.exit_code == 0, result.output
    assert "one-run audit of dpsgd" in result.stdout and "ε_LB = " in result.stdout and "PASS" in result.stdout
    assert "guesses" in result.stdout and "white-box gradient canaries" in result.stdout


def test_cli_run_scope_json_keys():
    result = invoke("audit", "--defense", "dpsgd", "--scope", "run", "--json", "--set", "train.epochs=2",
                    "--canaries", "200", "--seed", "2")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for key in ("audit.epsilon_lower_bound", "audit.estimator", "audit.mu_lower_bound", "audit.bounds",
                "audit.statistic", "audit.guesses", "audit.correct",
                "audit.canaries", "audit.canary_design", "audit.tests", "audit.passed", "audit.verdict",
                "privacy.epsilon", "privacy.delta", "privacy.noise_multiplier", "privacy.sample_rate",
                "privacy.steps", "defense.clip", "time.audit_s"):
        assert key in data, key
    assert data["seed"] == 2 and data["audit.scope"] == "run" and data["audit.canaries"] == 200


def test_cli_run_scope_exit_1_on_a_registered_broken_defense():
    broken = type("RegisteredReusedNoiseDPSGD", (ReusedNoiseDPSGD,), {})
    DEFENSES.register("dpsgd-reused-noise", "test plug-in: the same noise every step")(broken)
    try:
        result = invoke("audit", "--defense", "dpsgd-reused-noise", "--scope", "run", "--quiet",
                        "--set", "train.epochs=8", "--set", "privacy.epsilon=1")
    finally:
        DEFENSES.unregister("dpsgd-reused-noise")
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.stdout and "audit failed" in result.stderr


@pytest.mark.parametrize("args,field", [
    (["--trials", "1000"], "--trials"),
    (["--steps", "2"], "--steps"),
    (["--noise-multiplier", "1"], "--noise-multiplier"),
    (["--canaries", "1"], "--canaries"),
    (["--canaries", "100000"], "--canaries"),
])
def test_cli_run_scope_bad_input_exits_2(args, field):
    result = invoke("audit", "--defense", "dpsgd", "--scope", "run", *args)
    assert result.exit_code == 2, result.output
    assert field in result.stderr and "Traceback" not in result.output


# ---------------------------------------------------------------------------------------------------
# black-box input canaries


class NoiselessDPSGD(DPSGD):
    """Bug: no noise at all (the declared noise std unchanged)."""

    def release(self, batch_size):
        std = self.noise_multiplier * self._clipping.sensitivity
        grads = {n: s / batch_size for n, s in self._sum.items()}
        self.reset()
        return SharedGradient(grads, batch_size=batch_size, noise_std=std / batch_size)


def test_black_box_input_canaries_pass_the_real_run_and_catch_a_noiseless_one():
    """Input canaries (noise images with random labels) scored by the final model's loss only."""
    options = RunAuditOptions(canaries=1000, kind="input")
    settings = spec("dpsgd", privacy={"epsilon": 1.0})
    real = run_scope_audit(settings, options)
    broken = run_scope_audit(settings, options, defense_cls=NoiselessDPSGD)
    assert real["audit.passed"] and real["audit.canary_kind"] == "input"
    assert real["audit.statistic"] == "loss" and len(real["audit.tests"]) == 2 * len(GUESS_RULES)
    assert set(real["audit.bounds"]) == {"counting", "f-dp"}  # no Gaussian model of a loss
    assert "black-box input canaries" in real["audit.canary_design"]
    assert broken["audit.epsilon_lower_bound"] > 2 * broken["privacy.epsilon"], broken
    assert not broken["audit.passed"]


def test_canary_kind_belongs_to_the_run_scope():
    result = invoke("audit", "--defense", "dpsgd", "--canary-kind", "input")
    assert result.exit_code == 2 and "--canary-kind" in result.stderr


def test_noise_units_undo_the_release_scale_and_adaclip_shift():
    from dpeval.defenses.adaclip import AdaCliPDesign
    from dpeval.defenses.auditing import CanaryDesign

    names = {"w": torch.Size([2, 2])}

    class Fake:
        param_shapes = names

    shared = SharedGradient({"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]])}, batch_size=1, noise_std=0.5)
    assert torch.equal(CanaryDesign().noise_units(Fake(), shared), torch.tensor([2.0, 4.0, 6.0, 8.0]))
    shared.extra = {"adaclip.a": {"w": torch.ones(2, 2)},
                    "adaclip.noise_std": {"w": torch.tensor([[1.0, 2.0], [4.0, 8.0]])}}
    assert torch.equal(AdaCliPDesign().noise_units(Fake(), shared), torch.tensor([0.0, 0.5, 0.5, 0.375]))

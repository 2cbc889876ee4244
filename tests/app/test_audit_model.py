"""``dpeval audit --scope model``: K models from one θ₀, half with a target, only their final models scored.

Every built-in DP defense passes a small final-model audit and fails it with its noise planted out (the positive
control, at the same settings); a DP-SGD adding a tenth of its noise fails; the GDP estimator covers the true ε on
simulated Gaussian scores; every knob's bad value is refused in one line (exit 2) before anything trains."""

import json
import math

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from dpeval.audit import model as model_audit
from dpeval.audit.driver import dp_defense_names
from dpeval.audit.model import (
    ESTIMATORS,
    STATISTICS,
    ModelAuditOptions,
    balanced_labels,
    gdp_split_test,
    judge,
    run_model_audit,
)
from dpeval.cli import main
from dpeval.config import build_spec
from dpeval.core.accounting import epsilon_for
from dpeval.core.one_run_bounds import gdp_epsilon
from dpeval.defenses import DEFENSES
from dpeval.defenses.dpsgd import DPSGD
from dpeval.engine.training import FixedRateSampler
from tests.helpers import needs_fashionmnist, noiseless

# digits, logistic regression (650 parameters), 150 records, 5 full-batch SGD steps on the summed release. At a
# claimed ε = 1 (accounted μ = √5/σ ≈ 0.25): 100 models without noise reach ε_LB ≈ 2–9, so the control can fail; at
# a claimed ε of 10 even perfect separation could not (K = 100 proves at most ≈ 8.8 through the GDP reading).
SMALL = {"data": {"max_train": 150}, "model": {"name": "logreg"},
         "train": {"epochs": 5, "optimizer": "sgd", "lr": 0.01}, "privacy": {"epsilon": 1.0}}
MODELS = 100


def spec(name, **sections):
    raw = {"defense": {"name": name}, **{k: dict(v) for k, v in SMALL.items()}}
    for key, value in sections.items():
        raw.setdefault(key, {}).update(value)
    return build_spec(raw)


def audit(name, defense_cls=None, models=MODELS, **options):
    return run_model_audit(spec(name), ModelAuditOptions(models=models, **options), defense_cls=defense_cls)


@pytest.mark.parametrize("name", dp_defense_names())
def test_every_dp_defense_passes_the_final_model_audit(name):
    result = audit(name)
    assert result["audit.scope"] == "model" and result["audit.passed"] and result["audit.verdict"] == "PASS", result
    assert set(result["audit.anchor_reading"]) == set(STATISTICS)
    assert 0 <= result["audit.epsilon_lower_bound"] <= result["privacy.epsilon"]
    assert result["privacy.epsilon"] == pytest.approx(1.0, abs=0.01)
    assert result["privacy.sample_rate"] == 1.0 and result["privacy.steps"] == 5  # full batch: one step an epoch
    assert result["audit.models"] == MODELS and result["audit.models_with_target"] == MODELS // 2
    assert {(t["statistic"], t["estimator"]) for t in result["audit.tests"]} == {
        (s, e) for s in STATISTICS for e in ESTIMATORS}
    assert result["audit.estimator"] in ESTIMATORS and result["audit.mu_lower_bound"] >= 0


@pytest.mark.parametrize("name", dp_defense_names())
def test_every_dp_defense_without_its_noise_fails_the_final_model_audit(name):
    """Positive control of the test above, at its settings: every Gaussian draw zeroed, the ledger still claiming
    ε = 1 (measured ε_LB 4.4 for rs / random-freeze, 8.8 — every in-model apart from every out-model — for the
    others)."""
    result = audit(name, defense_cls=noiseless(DEFENSES.get(name)))
    assert result["privacy.epsilon"] == pytest.approx(1.0, abs=0.01)
    assert result["audit.epsilon_lower_bound"] > 2 * result["privacy.epsilon"], result
    assert not result["audit.passed"] and result["audit.verdict"] == "FAIL"


class TenthNoiseDPSGD(DPSGD):
    """Bug: every Gaussian draw scaled by 0.1 (σ / 10), the ledger unchanged."""

    def standard_normal(self, shape):
        return super().standard_normal(shape) * 0.1


def test_a_tenth_of_the_noise_fails_where_the_real_defense_passes():
    """σ / 10 makes μ ≈ 2.5 (measured μ̂ 2.1–2.6); 200 models show it (measured ε_LB 5.4 against ε = 1)."""
    real, broken = audit("dpsgd", models=200), audit("dpsgd", defense_cls=TenthNoiseDPSGD, models=200)
    assert real["audit.passed"]
    assert broken["audit.epsilon_lower_bound"] > 2 * broken["privacy.epsilon"], broken
    assert broken["audit.verdict"] == "FAIL"


def test_run_sampling_uses_the_runs_poisson_rate_and_steps():
    result = run_model_audit(spec("dpsgd", train={"batch_size": 30, "epochs": 2}),
                             ModelAuditOptions(models=20, sampling="run"))
    assert result["privacy.sample_rate"] == pytest.approx(30 / 150) and result["privacy.steps"] == 2 * 5
    assert result["audit.sampling"]["mode"] == "run" and result["audit.sampling"]["release_divides_by"] == 30
    assert result["privacy.sampling"] == "poisson"


def test_full_sampling_with_sgd_steps_on_the_summed_release():
    result = run_model_audit(spec("dpsgd", train={"weight_decay": 0.003}), ModelAuditOptions(models=20))
    sampling = result["audit.sampling"]
    assert sampling["release_divides_by"] == 150 and sampling["effective_lr"] == pytest.approx(0.01 * 150)
    assert sampling["weight_decay"] == pytest.approx(0.003 / 150)  # the decay per step stays lr × wd
    assert result["privacy.sampling"] == "full"
    # the accounted ε: T = 5 Gaussian releases at q = 1, σ calibrated there for the claimed ε = 1
    sigma = result["privacy.accounted_noise_multiplier"]
    assert result["privacy.epsilon"] == pytest.approx(epsilon_for(sigma, 1.0, 5, result["privacy.delta"]))
    assert result["privacy.epsilon"] == pytest.approx(1.0, abs=0.01) and sigma == pytest.approx(9.06, abs=0.01)


def test_an_index_target_leaves_the_pool_and_a_file_target_is_read(tmp_path):
    result = run_model_audit(spec("dpsgd"), ModelAuditOptions(models=20, target="7"))
    assert result["audit.target"]["kind"] == "index" and result["audit.sampling"]["pool"] == 149
    path = tmp_path / "target.npz"
    np.savez(path, x=np.full((1, 8, 8), 0.5, dtype=np.float32), y=np.array(3))
    result = run_model_audit(spec("dpsgd"), ModelAuditOptions(models=20, target=str(path)))
    assert result["audit.target"]["label"] == 3 and result["audit.sampling"]["pool"] == 150


def test_clipbkd_and_crafted_are_recorded():
    result = run_model_audit(spec("dpsgd"), ModelAuditOptions(models=20, target="clipbkd", init="crafted"))
    init, target = result["audit.init"], result["audit.target"]
    assert init["kind"] == "crafted" and init["epochs"] == 5 and init["lr"] == 0.01 and init["batch_size"] == 32
    assert init["split"] == "public" and init["records"] > 0 and len(init["source_indices_sha256"]) == 64
    assert target["kind"] == "clipbkd" and 0 <= target["label"] < 10


@needs_fashionmnist
@pytest.mark.slow
def test_crafted_initial_parameters_give_a_higher_bound_than_random():
    """The anchor's finding at a large ε (10): θ₀ pre-trained on the public split (6,000 Fashion-MNIST records) makes
    the target stand out more than the run's random initialisation. 200 models, logreg, 150 records, blank target;
    measured over seeds 0, 1, 2: ε_LB 2.23 / 0.40 / 2.09 crafted against 0.59 / 0.10 / 0.64 random, μ̂ 1.44–1.81
    against 0.81–1.18 (accounted μ 1.89); seed 0 here (≈ 45 s of CPU)."""
    def run(init):
        raw = spec("dpsgd", data={"name": "fashionmnist"}, privacy={"epsilon": 10.0})
        return run_model_audit(raw, ModelAuditOptions(models=200, init=init))

    random, crafted = run("random"), run("crafted")
    assert crafted["audit.epsilon_lower_bound"] > random["audit.epsilon_lower_bound"] + 0.5
    assert max(t["separation"] for t in crafted["audit.tests"]) > max(t["separation"] for t in random["audit.tests"])
    assert crafted["audit.passed"] and random["audit.passed"]


def test_a_file_init_holding_the_runs_initialisation_reproduces_random(tmp_path):
    """θ₀ from a file is the θ₀ every model starts from: the run's own initialisation saved and given back gives the
    random audit's numbers exactly; a perturbed one changes them."""
    from dpeval.runner import prepare

    state = prepare(spec("dpsgd")).model.state_dict()
    torch.save(state, tmp_path / "init.pt")
    torch.save({k: v + 0.5 if k.endswith("weight") else v for k, v in state.items()}, tmp_path / "moved.pt")
    results = [run_model_audit(spec("dpsgd"), ModelAuditOptions(models=20, init=init))
               for init in ("random", str(tmp_path / "init.pt"), str(tmp_path / "moved.pt"))]
    thresholds = [[t["threshold"] for t in r["audit.tests"]] for r in results]
    assert results[1]["audit.init"]["kind"] == "file"
    assert thresholds[0] == thresholds[1] and thresholds[0] != thresholds[2]


def test_kept_models_resume_an_audit_and_only_under_the_same_settings(tmp_path, monkeypatch):
    from dpeval.engine import shadow_training

    first = run_model_audit(spec("dpsgd"), ModelAuditOptions(models=20, keep=tmp_path / "models", group=8,
                                                             training="together"))
    assert len(list((tmp_path / "models").glob("shadow-*.pt"))) == 20
    (tmp_path / "models" / "shadow-13.pt").unlink()  # as if interrupted before model 13 was kept
    trained = []
    real = shadow_training._train_together
    monkeypatch.setattr(shadow_training, "_train_together", lambda *a, **k: trained.append(len(a[3])) or real(*a, **k))
    again = run_model_audit(spec("dpsgd"), ModelAuditOptions(models=20, keep=tmp_path / "models", group=8,
                                                             training="together"))
    assert trained == [1] and again["audit.tests"] == first["audit.tests"]  # only model 13 trained; same result
    assert (first["audit.models_resumed"], again["audit.models_resumed"]) == (0, 19)
    trained.clear()
    other = run_model_audit(spec("dpsgd", privacy={"epsilon": 2.0}),
                            ModelAuditOptions(models=20, keep=tmp_path / "models", training="together"))
    assert trained == [20] and other["privacy.epsilon"] == pytest.approx(2.0, abs=0.02)  # another key: all retrained


def test_sequential_training_keeps_each_model_and_resumes(tmp_path, monkeypatch):
    """One model at a time (the CPU default): each model is kept as soon as it is trained; an interrupted audit
    trains only the missing ones and gives the same result."""
    from dpeval.engine import shadow_training

    first = run_model_audit(spec("dpsgd"), ModelAuditOptions(models=20, keep=tmp_path / "models"))
    assert first["audit.training"] == "sequential" and first["audit.models_per_group"] == 1
    assert first["audit.models_resumed"] == 0
    (tmp_path / "models" / "shadow-4.pt").unlink()
    trained = []
    real = shadow_training.train
    monkeypatch.setattr(shadow_training, "train", lambda *a, **k: trained.append(1) or real(*a, **k))
    again = run_model_audit(spec("dpsgd"), ModelAuditOptions(models=20, keep=tmp_path / "models"))
    assert len(trained) == 1 and again["audit.tests"] == first["audit.tests"]
    assert again["audit.models_resumed"] == 19  # its time.train_s is model 4's alone


@pytest.mark.parametrize("name", ["dpsgd", "rs", "gep"])
def test_sequential_and_together_train_the_same_models(name):
    """The two training paths draw each model's sampling, noise and masks from the same streams and use the same
    per-sample gradients (torch.func here), so they train the same models up to float rounding: equal scores."""
    raw = spec(name, train={"engine": "func"})
    together = run_model_audit(raw, ModelAuditOptions(models=20, training="together"))
    sequential = run_model_audit(raw, ModelAuditOptions(models=20, training="sequential"))
    assert together["audit.training"] == "together" and sequential["audit.training"] == "sequential"
    for a, b in zip(together["audit.tests"], sequential["audit.tests"]):
        assert a["separation"] == pytest.approx(b["separation"], rel=1e-3, abs=1e-4), (a, b)


def test_sampler_full_batch_and_fixed_rate():
    gen = torch.Generator().manual_seed(0)
    full = FixedRateSampler(11, 10, "poisson", gen, rate=1.0, steps=3).epoch()
    assert len(full) == 3 and all(torch.equal(b, torch.arange(11)) for b in full)
    batches = FixedRateSampler(1001, 100, "poisson", gen, rate=0.1, steps=200).epoch()
    assert len(batches) == 200 and np.mean([len(b) for b in batches]) == pytest.approx(100, rel=0.05)


def test_labels_are_balanced_in_each_half():
    labels = balanced_labels(101, np.random.default_rng(0))
    assert labels[:50].sum() == 25 and labels[50:].sum() == 25


# ---------------------------------------------------------------------------------------------------
# the estimators on simulated scores


@pytest.mark.parametrize("mu", [0.5, 1.5])
def test_the_gdp_bound_covers_the_true_epsilon(mu):
    """Gaussian scores with known μ (out ~ N(0, 1), in ~ N(μ, 1): exactly μ-GDP), 200 models, the estimator alone
    at 95 %: the bound exceeds the true ε = ε_μ(δ) (and μ_LB exceeds μ) in at most 5 % of 200 repetitions."""
    rng, delta = np.random.default_rng(1), 1e-5
    truth = gdp_epsilon(mu, delta)
    over, bounds = 0, []
    for _ in range(200):
        labels = balanced_labels(200, rng)
        scores = rng.standard_normal(200) + mu * labels
        test = gdp_split_test(scores, labels, delta, 0.05)
        over += test["epsilon_lower_bound"] > truth
        assert (test["mu_lower_bound"] > mu) == (test["epsilon_lower_bound"] > truth)
        bounds.append(test["epsilon_lower_bound"])
    assert over <= 10, (over, truth)
    assert np.mean(bounds) > 0  # not vacuous


def test_the_gdp_bound_is_tight_on_well_separated_scores():
    """Power: 2,000 models at μ = 2 give μ_LB within 25 % of μ."""
    rng = np.random.default_rng(2)
    labels = balanced_labels(2000, rng)
    test = gdp_split_test(rng.standard_normal(2000) + 2.0 * labels, labels, 1e-5, 0.05)
    assert 1.5 < test["mu_lower_bound"] <= 2.0
    assert test["mu_ci"][0] <= test["mu_hat"] <= test["mu_ci"][1]


def test_the_anchors_reading_is_their_formula_over_every_threshold():
    """``anchor_reading`` against an independent computation of the anchor's ``compute_eps_lower_gdp`` (scipy's
    binomtest intervals at 1 − 2α, every unique score a threshold, the largest ε); on well separated scores it reads
    higher than the held-out test, whose threshold never sees the models that judge it."""
    from scipy.stats import binomtest, norm

    rng = np.random.default_rng(3)
    labels = balanced_labels(200, rng)
    scores = rng.normal(size=200) + 2.0 * labels
    best = 0.0
    for t in np.unique(scores):
        fp, fn = int(((scores >= t) & ~labels).sum()), int(((scores < t) & labels).sum())
        fpr = binomtest(fp, int((~labels).sum())).proportion_ci(confidence_level=0.9).high
        fnr = binomtest(fn, int(labels.sum())).proportion_ci(confidence_level=0.9).high
        best = max(best, norm.ppf(1 - fpr) - norm.ppf(fnr))
    reading = model_audit.anchor_reading(scores, labels, 1e-5)
    assert reading["mu"] == pytest.approx(best, rel=1e-6)
    assert reading["epsilon"] == pytest.approx(gdp_epsilon(best, 1e-5))
    assert reading["epsilon"] > gdp_split_test(scores, labels, 1e-5, 0.05 / 4)["epsilon_lower_bound"]


def test_judge_splits_the_confidence_and_refuses_non_finite_scores():
    rng = np.random.default_rng(3)
    labels = balanced_labels(100, rng)
    scores = {s: rng.standard_normal(100) for s in STATISTICS}
    tests = judge(scores, labels, 1e-5)
    assert len(tests) == 4 and all(t["confidence"] == pytest.approx(1 - 0.05 / 4) for t in tests)
    scores["loss"][0] = math.nan
    with pytest.raises(Exception, match="NaN or infinite"):
        judge(scores, labels, 1e-5)


# ---------------------------------------------------------------------------------------------------
# the command and bad input


def test_cli_prints_and_stores_the_result_keys():
    out = CliRunner().invoke(main, ["audit", "--defense", "dpsgd", "--scope", "model", "--models", "20", "--json",
                                    "--quiet", "--set", "data.max_train=150", "--set", "model.name=logreg",
                                    "--set", "train.epochs=2"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    for key in ("audit.scope", "audit.epsilon_lower_bound", "audit.estimator", "audit.mu_lower_bound", "audit.mu_hat",
                "audit.mu_hat_ci", "audit.models", "audit.models_with_target", "audit.init", "audit.target",
                "audit.sampling", "audit.statistic", "audit.tests", "audit.verdict", "audit.passed",
                "privacy.epsilon", "privacy.sample_rate", "privacy.steps", "time.audit_s"):
        assert key in result, key
    text = CliRunner().invoke(main, ["audit", "--defense", "dpsgd", "--scope", "model", "--models", "20", "--quiet",
                                     "--set", "data.max_train=150", "--set", "model.name=logreg",
                                     "--set", "train.epochs=2"])
    assert text.exit_code == 0 and "final-model audit of dpsgd" in text.output and "PASS" in text.output


def test_cli_exit_1_on_a_registered_noiseless_defense():
    DEFENSES.register("dpsgd-noiseless", "test plug-in: no noise")(type("RegisteredNoiseless", (noiseless(DPSGD),), {}))
    try:
        out = CliRunner().invoke(main, ["audit", "--defense", "dpsgd-noiseless", "--scope", "model", "--models", "40",
                                        "--quiet", "--set", "data.max_train=150", "--set", "model.name=logreg",
                                        "--set", "train.optimizer=sgd", "--set", "privacy.epsilon=1"])
    finally:
        DEFENSES.unregister("dpsgd-noiseless")
    assert out.exit_code == 1, out.output
    assert "FAIL" in out.stdout and "audit failed" in out.stderr


@pytest.mark.parametrize("args, message", [
    (["--models", "19"], "--models"),
    (["--models", "10001"], "--models"),
    (["--init", "nowhere.pt"], "--init"),
    (["--init", "WRONG_SHAPES"], "--init"),
    (["--target", "nowhere.npz"], "--target"),
    (["--target", "150"], "--target"),
    (["--target", "WRONG_SHAPE"], "--target"),
    (["--target", "clipbkd", "--set", "data.name=tokens", "--set", "model.name=null"], "--target"),
    (["--sampling", "sometimes"], "--sampling"),
    (["--training", "parallel"], "--training"),
    (["--keep-models", "WRONG_SHAPES"], "--keep-models"),
    (["--sampling", "run", "--set", "train.sampling=shuffle"], "--sampling"),
    (["--trials", "100"], "--trials"),
    (["--set", "model.weights=WRONG_SHAPES"], "model.weights"),
    (["--canaries", "100"], "--canaries"),
    (["--defense", "none"], "defense"),
])
def test_bad_input_is_refused_in_one_line_before_training(args, message, tmp_path, monkeypatch):
    def no_training(*a, **k):
        raise AssertionError("trained on bad input")

    monkeypatch.setattr(model_audit, "train_shadows", no_training)
    monkeypatch.setattr(model_audit, "train_shadows_sequential", no_training)
    wrong = tmp_path / "wrong.pt"
    torch.save({"weight": torch.zeros(3)}, wrong)
    wrong_target = tmp_path / "wrong.npz"
    np.savez(wrong_target, x=np.zeros((3, 5, 5), dtype=np.float32), y=np.array(1))
    args = [a.replace("WRONG_SHAPES", str(wrong)) if "WRONG_SHAPES" in a else str(wrong_target) if a == "WRONG_SHAPE"
            else a for a in args]
    out = CliRunner().invoke(main, ["audit", "--defense", "dpsgd", "--scope", "model", "--quiet",
                                    "--set", "data.max_train=150", "--set", "model.name=logreg", *args])
    assert out.exit_code == 2, out.output
    lines = [line for line in out.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], out.output


def test_model_scope_flags_are_refused_in_other_scopes():
    for scope in ("release", "run"):
        out = CliRunner().invoke(main, ["audit", "--defense", "dpsgd", "--scope", scope, "--models", "50"])
        assert out.exit_code == 2 and "--models: only with --scope model" in out.output

"""``ig``: Inverting Gradients against what defenses release (digits / cnn3 at init unless stated)."""

import dataclasses
import time

import numpy as np
import pytest
import torch

from dpeval.attacking import write_artefacts
from dpeval.attacks import ATTACKS
from dpeval.attacks.ig import GradientMatcher, IGParams, invert
from dpeval.config import build_spec
from dpeval.core.errors import ConfigError
from dpeval.core.params import from_dict
from dpeval.core.verdicts import Verdict
from dpeval.defenses.base import Capabilities, Defense, DefenseContext, SharedGradient
from tests.helpers import untrained_view


def context(tmp_path, defense="none", epsilon=None, model=None, **attack):
    """An untrained run's (attacker's view, task) (states ``init`` and ``final``); one target unless ``targets``
    is given."""
    attack = {"at": "init", "targets": 1, **attack}
    raw = {"defense": defense, "attacks": ["ig"], "attack": attack, "device": "cpu"}
    if epsilon is not None:
        raw["privacy"] = {"epsilon": epsilon}
    if model is not None:
        raw["model"] = {"name": model}
    spec = build_spec(raw)
    return untrained_view(spec, tmp_path), spec


def run_ig(ctx, spec):
    cls = ATTACKS.get("ig")
    return cls(spec.attack["ig"]).play(*ctx)


class MaskingDefense(Defense):
    """Test-local defense: the plain mean gradient, with a fixed random half of the coordinates withheld.
    Withheld coordinates carry ``fill``: zeros, or large garbage a mask-aware attacker must ignore."""

    capabilities = Capabilities(accounted=False, auditable=False)
    fill = "zeros"
    rate = 0.5

    def clip_and_accumulate(self, grads):
        for name, g in grads.items():
            self._sum[name] += g.sum(dim=0)
        self.samples_seen += next(iter(grads.values())).shape[0]

    def release(self, batch_size):
        gen = torch.Generator().manual_seed(1234)  # the same mask at every release
        garbage = torch.Generator().manual_seed(99)
        grads, mask = {}, {}
        for name, s in self._sum.items():
            keep = torch.rand(s.shape, generator=gen) >= self.rate
            other = torch.zeros_like(s) if self.fill == "zeros" else 10 * torch.randn(s.shape, generator=garbage)
            grads[name] = torch.where(keep, s / self.samples_seen, other)
            mask[name] = keep
        self.reset()
        return SharedGradient(grads, batch_size=batch_size, noise_std=0.0, mask=mask)


def with_defense(ctx, fill, rate=0.5):
    view, task = ctx
    shapes = {n: p.shape for n, p in view.architecture.named_parameters()}
    cls = type(f"Masking_{fill}", (MaskingDefense,), {"fill": fill, "rate": rate})
    oracle = dataclasses.replace(
        view.release, make_defense=lambda streams, bound_to=None: cls(None, DefenseContext(shapes, 0.0, streams)))
    return dataclasses.replace(view, release=oracle), task


# ------------------------------------------------------------------------------------------------------------
# parameters


@pytest.mark.parametrize("key,value", [
    ("batch_size", 0), ("at", "middle"), ("at", "epoch:-1"), ("at", ["init", "middle"]), ("at", []),
    ("at", "trajectory:0"), ("at", 3), ("targets", 0), ("labels", "guessed"), ("mask_aware", "yes"),
    ("ig_objective", "l1"), ("ig_optimizer", "sgd"), ("ig_iterations", 0), ("ig_restarts", 0),
    ("ig_lr", 0), ("ig_tv", -1.0), ("ig_signed", 1), ("ig_decay", "no"),
])
def test_every_parameter_is_validated_naming_its_key(key, value):
    with pytest.raises(ConfigError, match=f"attack.{key}: must"):
        from_dict(IGParams, {key: value}, "attack")


def test_config_path_validates_attack_keys():
    with pytest.raises(ConfigError, match="attack.ig_objective"):
        build_spec({"attacks": ["ig"], "attack": {"ig_objective": "l1"}})
    with pytest.raises(ConfigError, match="attack.ig_nonsense"):
        build_spec({"attacks": ["ig"], "attack": {"ig_nonsense": 1}})
    spec = build_spec({"attacks": ["ig"], "attack": {"at": "epoch:3"}})
    assert ATTACKS.get("ig").wanted_states(spec.attack["ig"]) == {"epoch:3"}
    spec = build_spec({"attacks": ["ig"], "attack": {"at": ["init", "epoch:2", "trajectory:2", "final"]}})
    assert ATTACKS.get("ig").wanted_states(spec.attack["ig"]) == {"epoch:2", "trajectory:2"}
    assert ATTACKS.get("ig").wanted_states(IGParams()) == {"trajectory"}  # the default: states while training


def test_attacking_an_epoch_the_run_does_not_have_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="attack.at"):  # raised while preparing the run, before training
        ctx, spec = context(tmp_path, at="epoch:50")
        run_ig(ctx, spec)


# ------------------------------------------------------------------------------------------------------------
# bars


def test_no_defense_default_budget_recognisable(tmp_path):
    ctx, spec = context(tmp_path)
    start = time.perf_counter()
    result = run_ig(ctx, spec)
    elapsed = time.perf_counter() - start
    m = result.metrics
    print(f"ig none: PSNR {m['psnr']:.2f} dB, SSIM {m['ssim']:.3f}, MSE {m['mse']:.5f}, {elapsed:.1f} s")
    # measured 74.2 dB at seed 0 (1000 iterations; 36.1 dB before the random streams changed); the aim is 20 dB
    assert m["psnr"] >= 30.0
    assert m["ssim"] >= 0.95
    assert m["label_accuracy"] == 1.0
    assert m["psnr"] > m["baseline_psnr"] + 20 and m["baseline_psnr"] >= m["baseline_psnr_mean"]
    assert m["state"] == "init" and m["epoch"] == 0 and m["density"] == 1.0
    assert write_artefacts(result.artefacts, tmp_path)["png"] == tmp_path / "ig-reconstruction.png"  # as the runner
    assert (tmp_path / "ig-reconstruction.png").is_file()


@pytest.mark.slow
def test_verdicts_undefended_leaks_and_dpsgd_at_epsilon_one_does_not(tmp_path):
    """The verdict rule (attacks/verdict.py) on six targets: an undefended release leaks, a DP-SGD ε = 1
    release is at the level of the data-free guesses. The DP-SGD release is attacked at the default budget (1,000
    steps); the undefended one, the positive control, needs 200 to win on every target (weakest target 30.4 dB vs
    its best guess 11.2 dB, seed 0; 31.5, 30.1, 60.9 dB at seeds 1–3)."""
    ctx, spec = context(tmp_path / "none", targets=6, ig_iterations=200)
    plain_result = run_ig(ctx, spec)
    plain = plain_result.metrics
    ctx, spec = context(tmp_path / "dp", defense="dpsgd", epsilon=1.0, targets=6)
    dp_result = run_ig(ctx, spec)
    dp = dp_result.metrics
    print(f"ig none: {plain_result.verdict} (PSNR {plain['psnr']:.1f} dB, p {plain['p_value']:.3g}); dpsgd ε=1: "
          f"{dp_result.verdict} (PSNR {dp['psnr']:.1f} dB vs best guess {dp['baseline_psnr']:.1f}, "
          f"p {dp['p_value']:.3g})")
    assert plain_result.verdict is Verdict.LEAKS
    assert plain_result.states["init"]["wins"] == 6 and plain["p_value"] == pytest.approx(1 / 64)
    assert dp_result.verdict is Verdict.NO_LEAK and dp["p_value"] > 0.05
    assert dp["noise_std"] > 1.0  # σ·C/B with B = 1
    # measured 5.3 dB vs best data-free guesses 12.1 (public mean image), 8.5 (constant mean), 5.7 (noise)
    assert dp["psnr"] < dp["baseline_psnr"] and dp["ssim"] < 0.3
    assert dp["baseline_psnr"] == plain["baseline_psnr"]  # the same targets and guesses


# ------------------------------------------------------------------------------------------------------------
# mask-aware matching


def test_matching_loss_ignores_masked_coordinates():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
    x, y = torch.rand(1, 1, 4, 4), torch.tensor([2])
    target = {n: torch.randn_like(p) for n, p in model.named_parameters()}
    mask = {n: torch.rand_like(p) > 0.5 for n, p in model.named_parameters()}
    other = {n: torch.where(mask[n], t, 1e3 * torch.randn_like(t)) for n, t in target.items()}
    fmask = {n: m.float() for n, m in mask.items()}
    x, y = x[None], y[None]  # one problem
    for objective in ("cosine", "l2"):
        aware = [float(GradientMatcher(model, [t], [fmask], y, objective)(x)[0].detach()) for t in (target, other)]
        naive = [float(GradientMatcher(model, [t], [None], y, objective)(x)[0].detach()) for t in (target, other)]
        assert aware[0] == pytest.approx(aware[1], rel=1e-6)
        assert naive[0] != pytest.approx(naive[1], rel=1e-2)


def test_mask_aware_attack_ignores_withheld_values_and_beats_the_naive_one(tmp_path):
    ctx, spec = context(tmp_path, ig_iterations=400)
    params = spec.attack["ig"]
    cls = ATTACKS.get("ig")
    zeros = cls(params).play(*with_defense(ctx, "zeros")).metrics
    garbage = cls(params).play(*with_defense(ctx, "garbage")).metrics
    naive = cls(dataclasses.replace(params, mask_aware=False)).play(*with_defense(ctx, "garbage")).metrics
    print(f"masked 50%: aware {zeros['psnr']:.1f} / {garbage['psnr']:.1f} dB, naive on garbage {naive['psnr']:.1f} dB")
    assert zeros["density"] == pytest.approx(0.5, abs=0.02)
    assert garbage["psnr"] == pytest.approx(zeros["psnr"], abs=1e-6)  # the withheld values never mattered
    assert garbage["psnr"] >= 25.0
    assert naive["psnr"] < garbage["psnr"] - 10.0


# ------------------------------------------------------------------------------------------------------------
# labels, variants


def test_recovered_labels_for_a_batch(tmp_path):
    ctx, spec = context(tmp_path, batch_size=4, labels="recovered", ig_iterations=400)
    m = run_ig(ctx, spec).metrics
    print(f"ig B=4 recovered labels: PSNR {m['psnr']:.2f} dB, label accuracy {m['label_accuracy']}")
    assert m["label_accuracy"] == 1.0
    assert m["psnr"] >= 20.0  # Hungarian-matched mean of 4 per-image PSNRs


def test_dlg_variant_l2_with_lbfgs(tmp_path):
    ctx, spec = context(tmp_path, ig_objective="l2", ig_iterations=300, labels="recovered")
    m = run_ig(ctx, spec).metrics
    print(f"DLG (l2 + L-BFGS): PSNR {m['psnr']:.2f} dB")
    assert spec.attack["ig"].optimizer == "lbfgs"  # auto: l2 → L-BFGS
    assert m["label_accuracy"] == 1.0
    assert m["psnr"] >= 20.0


def test_restarts_keep_the_best_matching_loss_of_each_problem():
    torch.manual_seed(0)
    from dpeval.core.models import build_model
    from dpeval.core.per_sample import PerSampleGradients

    model = build_model("cnn3", (1, 8, 8), 10, (0.3,), (0.4,)).eval()
    x, y = torch.rand(2, 1, 8, 8), torch.tensor([3, 7])
    grads = PerSampleGradients(model)(x, y)
    targets = [{k: v[i] for k, v in grads.items()} for i in range(2)]  # two problems of one image each
    params = IGParams(ig_iterations=30, ig_restarts=3)
    best, trials = invert(model, targets, [None, None], y[:, None], (1, 8, 8), (0.3,), (0.4,), params,
                          torch.Generator().manual_seed(0), torch.device("cpu"))
    assert len(trials) == 3 and best.pixels.shape == (2, 1, 1, 8, 8)
    for t in range(2):
        assert float(best.matching[t]) == min(float(trial.matching[t]) for trial in trials)
        assert len({round(float(trial.matching[t]), 9) for trial in trials}) > 1  # different random inits
    assert 0.0 <= float(best.pixels.min()) and float(best.pixels.max()) <= 1.0


@pytest.mark.parametrize("optimizer", ["adam", "lbfgs"])
def test_problems_solved_together_equal_problems_solved_alone(optimizer):
    """Side by side (vmap), T problems give what each gives alone: nothing couples them."""
    torch.manual_seed(0)
    from dpeval.core.models import build_model
    from dpeval.core.per_sample import PerSampleGradients

    model = build_model("cnn3", (1, 8, 8), 10, (0.3,), (0.4,)).eval()
    x, y = torch.rand(3, 1, 8, 8), torch.tensor([1, 4, 9])
    grads = PerSampleGradients(model)(x, y)
    targets = [{k: v[i] for k, v in grads.items()} for i in range(3)]
    params = IGParams(ig_iterations=40, ig_optimizer=optimizer)
    args = ((1, 8, 8), (0.3,), (0.4,), params)
    together, _ = invert(model, targets, [None] * 3, y[:, None], *args, torch.Generator().manual_seed(5),
                         torch.device("cpu"))
    # Problem 0 draws the same start alone (the first numbers of the same generator): it must end the same,
    # however the other problems went.
    alone, _ = invert(model, targets[:1], [None], y[:1, None], *args, torch.Generator().manual_seed(5),
                      torch.device("cpu"))
    assert torch.allclose(alone.pixels[0], together.pixels[0], atol=1e-5)
    assert float(alone.matching[0]) == pytest.approx(float(together.matching[0]), abs=1e-6)
    assert not torch.allclose(together.pixels[0], together.pixels[1])


# ------------------------------------------------------------------------------------------------------------
# natural RGB images (scikit-image's sample photographs) against the DP-CNN


def natural_thumbnails(names=("astronaut", "chelsea", "coffee", "rocket")):
    from skimage import data
    from skimage.transform import resize

    out = []
    for name in names:
        img = getattr(data, name)()
        h, w = img.shape[:2]
        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        out.append(resize(img[top:top + side, left:left + side], (32, 32), anti_aliasing=True))
    return torch.tensor(np.stack(out), dtype=torch.float32).permute(0, 3, 1, 2).contiguous()


@pytest.mark.slow
def test_natural_rgb_images_against_dpcnn_at_init(tmp_path):
    from dpeval.attacks import image_metrics
    from dpeval.core.models import build_model
    from dpeval.core.per_sample import PerSampleGradients

    x = natural_thumbnails()
    mean, std = tuple(x.mean(dim=(0, 2, 3)).tolist()), tuple(x.std(dim=(0, 2, 3)).tolist())
    torch.manual_seed(0)
    model = build_model("dpcnn", (3, 32, 32), 10, mean, std).eval()
    target_x, y = x[1:2], torch.tensor([1])  # chelsea the cat
    target = {k: v[0] for k, v in PerSampleGradients(model)(target_x, y).items()}
    params = IGParams(ig_iterations=400)  # 30.0 dB (1,000: 31.5 dB); the baseline + 6 dB is 24.2 dB
    start = time.perf_counter()
    best, _ = invert(model, [target], [None], y[None], (3, 32, 32), mean, std, params,
                     torch.Generator().manual_seed(0), torch.device("cpu"))
    metrics, _ = image_metrics.score(target_x, best.pixels[0])
    image_metrics.save_grid(target_x, best.pixels[0], tmp_path / "natural.png")
    print(f"ig dpcnn natural 32x32: PSNR {metrics['psnr']:.2f} dB, SSIM {metrics['ssim']:.3f}, "
          f"{time.perf_counter() - start:.0f} s")
    base = image_metrics.baselines(target_x, mean, torch.Generator().manual_seed(5))
    assert metrics["psnr"] >= 18.0
    assert metrics["psnr"] > base["baseline_psnr_mean"] + 6

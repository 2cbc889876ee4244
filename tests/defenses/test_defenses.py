"""DP-SGD and the no-defense baseline: clipping bounds, noise scale, and a cross-check against Opacus."""

import math

import pytest
import torch
import torch.nn.functional as F
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from scipy import stats

from dpeval.core.errors import ConfigError
from dpeval.core.models import build_model
from dpeval.core.params import from_dict
from dpeval.core.per_sample import PerSampleGradients, micro_batches
from dpeval.core.settings import ModelConfig
from dpeval.core.streams import Streams
from dpeval.defenses import DEFENSES
from dpeval.defenses.base import DefenseContext
from dpeval.defenses.dpsgd import ClipParams


def make(name, shapes, sigma=0.0, clip=1.0, seed=0):
    cls = DEFENSES.get(name)
    params = ClipParams(clip=clip) if name == "dpsgd" else cls.Params()
    return cls(params, DefenseContext(shapes, sigma, Streams(seed)))


def small_model():
    torch.manual_seed(1)
    return build_model("cnn3", (1, 8, 8), 10, (0.3,), (0.4,))


def shapes_of(model):
    return {n: p.shape for n, p in model.named_parameters()}


def flat(grads):
    return torch.cat([g.reshape(-1) for g in grads.values()])


def test_registry_lists_foundation_defenses():
    assert {"none", "dpsgd"} <= set(DEFENSES.names())
    with pytest.raises(ConfigError, match="dpsgd"):
        DEFENSES.get("nope", field="defense")


def test_clip_must_be_positive():
    with pytest.raises(ConfigError, match="defense.clip: must satisfy 0 < clip"):
        from_dict(ClipParams, {"clip": 0.0}, "defense")
    with pytest.raises(ConfigError, match="defense.clip"):
        from_dict(ClipParams, {"clip": -1.0}, "defense")
    assert from_dict(ClipParams, {"clip": 0.5}, "defense").clip == 0.5


def test_each_sample_contributes_at_most_clip():
    shapes = {"w": torch.Size([50]), "b": torch.Size([3])}
    defense = make("dpsgd", shapes, clip=0.7)
    scales = torch.tensor([1e-3, 0.5, 1.0, 10.0, 1e4])
    for s in scales:
        g = {"w": torch.randn(1, 50) * s, "b": torch.randn(1, 3) * s}
        defense.clip_and_accumulate(g)
        released = flat(defense.release(batch_size=1).grads)
        original = flat({k: v[0] for k, v in g.items()})
        # C·g/(‖g‖ + 1e-6) in float32: its norm is C up to rounding, which lands on either side of C by a few
        # ulps depending on the reduction order (the thread count); more than that would be a clipping bug
        assert released.norm() <= 0.7 * (1 + 1e-6)
        if original.norm() < 0.7:  # below the bound: untouched (up to the 1e-6 guard)
            torch.testing.assert_close(released, original, rtol=1e-5, atol=1e-7)
        else:  # above: same direction, norm C
            assert released.norm() == pytest.approx(0.7, rel=1e-5)
            assert torch.nn.functional.cosine_similarity(released, original, dim=0) > 0.9999


def test_noise_std_is_sigma_clip_over_batch():
    """Zero gradients, so the release is pure noise: its std must be σ·C/B (chi-square test on 200k
    coordinates) and Gaussian (KS test). Halving the noise would fail this by hundreds of sigmas."""
    sigma, clip, batch = 1.3, 0.5, 64
    shapes = {"a": torch.Size([100_000]), "b": torch.Size([100, 1000])}
    defense = make("dpsgd", shapes, sigma=sigma, clip=clip)
    defense.clip_and_accumulate({k: torch.zeros(3, *s) for k, s in shapes.items()})
    shared = defense.release(batch)
    noise = flat(shared.grads).double()
    expected = sigma * clip / batch
    assert shared.noise_std == pytest.approx(expected)
    n = noise.numel()
    chi2 = float((noise**2).sum() / expected**2)
    p_value = 2 * min(stats.chi2.cdf(chi2, n), stats.chi2.sf(chi2, n))
    assert p_value > 1e-4, (chi2, n)
    assert abs(float(noise.mean())) < 5 * expected / math.sqrt(n)
    assert stats.kstest((noise / expected).numpy(), "norm").pvalue > 1e-4


def test_noise_is_fresh_and_sum_resets():
    shapes = {"w": torch.Size([1000])}
    defense = make("dpsgd", shapes, sigma=1.0)
    defense.clip_and_accumulate({"w": torch.ones(2, 1000)})
    a = defense.release(2).grads["w"]
    b = defense.release(2).grads["w"]  # nothing accumulated: pure noise, and a different draw
    assert not torch.equal(a, b)
    assert abs(float(b.mean())) < 0.2  # the first step's signal did not leak into the second


def test_empty_batch_still_releases_noise():
    defense = make("dpsgd", {"w": torch.Size([500])}, sigma=2.0)
    shared = defense.release(10)
    assert shared.grads["w"].std() == pytest.approx(0.2, rel=0.2)


def test_none_is_the_plain_mean_gradient():
    model = small_model()
    x, y = torch.rand(12, 1, 8, 8), torch.randint(0, 10, (12,))
    defense = make("none", shapes_of(model))
    psg = PerSampleGradients(model)
    for xb, yb in micro_batches(x, y, 5):
        defense.clip_and_accumulate(psg(xb, yb))
    shared = defense.release(batch_size=999)  # non-private: divides by the samples actually seen
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(shared.grads[name], p.grad, rtol=1e-5, atol=1e-6)
    assert DEFENSES.get("none").capabilities.accounted is False


def test_micro_batching_does_not_change_the_release():
    model = small_model()
    x, y = torch.rand(20, 1, 8, 8), torch.randint(0, 10, (20,))
    psg = PerSampleGradients(model)
    releases = []
    for size in (1, 7, 20):
        defense = make("dpsgd", shapes_of(model), sigma=0.0, clip=0.1)
        for xb, yb in micro_batches(x, y, size):
            defense.clip_and_accumulate(psg(xb, yb))
        releases.append(flat(defense.release(20).grads))
    torch.testing.assert_close(releases[0], releases[1], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(releases[0], releases[2], rtol=1e-5, atol=1e-7)


def per_sample_norms(grads):
    """Norm of each sample's whole gradient, from per-parameter tensors [b, *param]."""
    return torch.stack([g.flatten(1).norm(dim=1) for g in grads]).norm(dim=0)


SMALL_TRANSFORMER = ModelConfig(depth=2, width=16, heads=2)


@pytest.mark.parametrize("model_name,shape", [("cnn3", (1, 8, 8)), ("mlp", (1, 8, 8)), ("dpcnn-small", (1, 28, 28)),
                                              ("vit", (1, 8, 8)), ("gpt", (1, 1, 12))])
def test_clipped_sum_matches_opacus_dp_optimizer(model_name, shape):
    """Same model, batch and C: dpeval's release with σ = 0 equals Opacus' DPOptimizer gradient."""
    torch.manual_seed(3)
    batch, clip, vocab = 16, 0.05, 7  # small C so that every sample is clipped (asserted below, on both sides)
    if model_name == "gpt":  # token ids as the float values of a token dataset (b, 1, 1, T), identity normalisation
        model = build_model("gpt", shape, 10, (0.0,), (1.0,), settings=SMALL_TRANSFORMER, vocab=vocab)
        x = torch.randint(0, vocab, (batch, *shape)).float()
    else:
        settings = SMALL_TRANSFORMER if model_name == "vit" else None
        model = build_model(model_name, shape, 10, (0.5,), (0.25,), settings=settings)
        x = torch.rand(batch, *shape)
    y = torch.randint(0, 10, (batch,))

    defense = make("dpsgd", shapes_of(model), sigma=0.0, clip=clip)
    grads = PerSampleGradients(model)(x, y)
    assert bool((per_sample_norms(grads.values()) > clip).all())
    defense.clip_and_accumulate(grads)
    ours = defense.release(batch).grads

    gsm = GradSampleModule(model, loss_reduction="mean")
    optimizer = DPOptimizer(torch.optim.SGD(gsm.parameters(), lr=0.1), noise_multiplier=0.0,
                            max_grad_norm=clip, expected_batch_size=batch, loss_reduction="mean")
    optimizer.zero_grad()
    F.cross_entropy(gsm(x), y).backward()
    assert bool((per_sample_norms(p.grad_sample for p in gsm.parameters()) > clip).all())
    assert optimizer.pre_step()
    for (name, _), p in zip(model.named_parameters(), gsm.parameters()):
        torch.testing.assert_close(ours[name], p.grad, rtol=0, atol=1e-6)
    gsm._close()

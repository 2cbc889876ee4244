"""dpeval on a CUDA device: what a GPU run releases, trains and resumes is what the CPU path does.

Run with ``pytest -m cuda`` on a machine with a GPU; everywhere else these tests are skipped with a reason.
``DPEVAL_TEST_DEVICE=cpu pytest -m cuda`` runs them with the CPU in the GPU's place (every comparison then
compares the CPU with itself): a check of the tests' own code on a machine without a GPU.

- **Release.** Every registered defense (with the variants that change its plan), on both engines, given the
  same weights, examples, masks and public statistics: the noise-free release on the device equals the CPU's
  to float32 rounding (TF32 off). GEP's power-iteration start is drawn on the device, so the device defense is
  handed the CPU's anchors (its ``state_dict``) — the rest of its release is compared as computed.
- **Noise.** The noise a device release adds (noisy release − noise-free release, same streams) has the
  standard deviation the CPU's has, and for DP-SGD the one the mechanism states: σ·C/B per coordinate.
  Noise on the device is drawn from a device generator, so the draws differ from the CPU's; their scale may not
  (the test draws the two from different run seeds, so even ``DPEVAL_TEST_DEVICE=cpu`` compares two samples).
- **Training.** A short ``dpeval run --device cuda`` of every defense trains on the device, records it, spends
  the ε the CPU run spends and learns.
- **bfloat16.** ``train.precision: bf16`` on the device: float32 per-sample gradients near float32's, each
  clipped contribution at the clip bound, a short run that learns as its float32 twin does.
- **Resume.** A CUDA run interrupted mid-training and run again resumes from its checkpoint (the device's
  noise generator state included) and ends where an uninterrupted CUDA run ends, to float tolerance (cuDNN's
  weight-gradient kernels may sum in another order between runs, so not bit for bit).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from click.testing import CliRunner

from dpeval.cli import main
from dpeval.config import build_spec
from dpeval.core.models import build_model
from dpeval.core.per_sample import PerSampleGradients
from dpeval.core.streams import Streams
from dpeval.defenses import DEFENSES
from dpeval.defenses.base import DefenseContext
from dpeval.defenses.clipping import GroupClipping
from dpeval.defenses.dpsgd import DPSGD, ClipParams
from dpeval.defenses.groupwise import resolve_groups
from dpeval.engine.lean import LeanEngine
from dpeval.runner import prepare
from tests.app.test_resume import comparable, interrupt_at, model_of

DEVICE = os.environ.get("DPEVAL_TEST_DEVICE", "cuda")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                       reason="needs a CUDA device (run `pytest -m cuda` on a GPU machine)"),
]

MODELS = {
    "cnn3": {},  # digits: strided convs without bias, a Linear head
    "resnet20-gn": {"name": "synthetic", "synthetic": {"shape": [3, 8, 8], "size": 200}},  # GroupNorm
}
VARIANTS = {  # as tests/engine/test_lean_defenses.py: the parameters that change a defense's plan
    "rs": [{"final_rate": 0.7, "schedule": "constant"}],
    "random-freeze": [{"final_rate": 0.6, "ramp_epochs": 1}],
    "gep": [{"num_bases": 20}, {"num_bases": 20, "biased": True}],
    "groupwise": [{"groups": "layer"}, {"groups": "uniform:2", "clip_fn": "abadi"}],
    "adaclip": [{"clip": 0.1}],
}
CASES = [(name, params) for name in DEFENSES.names() for params in VARIANTS.get(name, [{}])]


@pytest.fixture(autouse=True)
def _float32():
    """Compare float32 with float32: TF32 matrix units would round to 10 bits on the device only."""
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def prepared(name: str, params: dict, model: str, device: str):
    spec = build_spec({"defense": {"name": name, **params}, "model": {"name": model}, "data": MODELS[model],
                       "train": {"epochs": 2, "batch_size": 32}, "privacy": {"noise_multiplier": 1.0},
                       "device": device})
    prep = prepare(spec)
    prep.model.to(device)
    return prep


def started(prep, name: str, sigma: float, state: dict | None = None, seed: int = 1):
    """A defense at noise multiplier ``sigma`` after ``begin_epoch`` (AdaCliP with non-trivial statistics,
    ``state`` loaded where given)."""
    defense = prep.make_defense(Streams(seed).scope("victim"))
    defense.noise_multiplier = sigma
    defense.begin_epoch(1, prep.spec.train.epochs)
    if name == "adaclip":  # non-trivial public statistics: a ≠ 0, b ≠ 1
        gen, shapes = torch.Generator().manual_seed(0), defense.param_shapes.items()
        defense.load_state_dict({"m": {n: 1e-2 * torch.randn(s, generator=gen) for n, s in shapes},
                                 "b": {n: torch.rand(s, generator=gen) + 0.5 for n, s in shapes}})
    if state is not None:
        defense.load_state_dict(state)
    return defense


def flat(grads: dict[str, torch.Tensor], device: str) -> torch.Tensor:
    assert all(g.device.type == torch.device(device).type for g in grads.values())
    return torch.cat([g.detach().reshape(-1).double().cpu() for g in grads.values()])


def release(prep, name: str, engine: str, sigma: float, state: dict | None = None):
    """One logical batch of 20 examples in micro-batches of 8, released at noise multiplier ``sigma``: the
    flat release (float64, on the CPU) and the defense's ``state_dict`` before the batch."""
    defense = started(prep, name, sigma, state)
    state = defense.state_dict()
    x, y = prep.task.train.x[:20].to(prep.device), prep.task.train.y[:20].to(prep.device)
    psg, bk = PerSampleGradients(prep.model), LeanEngine(prep.model)
    for lo in range(0, len(y), 8):
        xb, yb = x[lo:lo + 8], y[lo:lo + 8]
        if engine == "func":
            defense.clip_and_accumulate(psg(xb, yb))
        else:
            defense.accumulate_lean(bk(xb, yb, defense.lean_plan()))
    return flat(defense.release(32).grads, str(prep.device)), state


def on_cpu_and_device(name: str, params: dict, model: str, engine: str, sigma: float):
    """The release on the CPU and on the device, from the same weights (and for GEP the same anchors)."""
    cpu = prepared(name, params, model, "cpu")
    dev = prepared(name, params, model, DEVICE)
    dev.model.load_state_dict(cpu.model.state_dict())
    on_cpu, state = release(cpu, name, engine, sigma)
    on_dev, _ = release(dev, name, engine, sigma, state if name == "gep" else None)
    return on_cpu, on_dev


@pytest.mark.parametrize("engine", ["lean", "func"])
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("name,params", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_the_release_on_the_device_equals_the_cpus(name, params, model, engine):
    on_cpu, on_dev = on_cpu_and_device(name, params, model, engine, sigma=0.0)
    assert on_cpu.abs().max() > 0
    assert float((on_cpu - on_dev).abs().max() / on_cpu.abs().max()) < 1e-4


def pure_noise(prep, name: str, sigma: float, releases: int, state: dict | None, seed: int) -> torch.Tensor:
    """``releases`` releases of an empty batch at ``sigma`` minus the same at 0 (AdaCliP's shift cancels): the
    noise alone, drawn from the streams of run seed ``seed``."""
    noisy, clean = started(prep, name, sigma, state, seed), started(prep, name, 0.0, state, seed)
    device = str(prep.device)
    return torch.cat([flat(noisy.release(32).grads, device) - flat(clean.release(32).grads, device)
                      for _ in range(releases)])


@pytest.mark.parametrize("name,params", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_the_noise_on_the_device_has_the_cpus_scale(name, params):
    """The device's noise (its own generator, another run seed here so the CPU check is not trivial) has the
    CPU's standard deviation, to 6 standard errors of the two estimates: with n independent Gaussian draws an
    estimate of the std is off by about 1/√(2n). B-GEP's noise lives in the k = 20 embedding dimensions only
    (lifted by the bases V), so it is sampled over 1,000 releases."""
    if name == "none":
        pytest.skip("none adds no noise")
    params = {**params, "anchor_every": 10**9} if name == "gep" else params  # one set of bases for every release
    sigma, biased = 2.0, params.get("biased", False)
    releases = 1000 if biased else 1
    cpu = prepared(name, params, "resnet20-gn", "cpu")
    dev = prepared(name, params, "resnet20-gn", DEVICE)
    dev.model.load_state_dict(cpu.model.state_dict())
    state = started(cpu, name, 0.0).state_dict() if name == "gep" else None
    noise_cpu = pure_noise(cpu, name, sigma, releases, state, seed=1)
    noise_dev = pure_noise(dev, name, sigma, releases, state, seed=2)
    draws = releases * (params["num_bases"] if biased else int((noise_cpu != 0).sum()))
    assert draws >= 20_000
    assert abs(float(noise_dev.std() / noise_cpu.std()) - 1) < 6 / draws**0.5
    assert abs(float(noise_dev.mean())) < 6 * float(noise_dev.std()) / draws**0.5
    if name == "dpsgd":  # the mechanism itself: N(0, (σC)²) on the sum, divided by B = 32
        assert abs(float(noise_dev.std()) / (sigma * 1.0 / 32) - 1) < 6 / draws**0.5


@pytest.mark.parametrize("name", DEFENSES.names())
def test_a_short_run_of_every_defense_trains_on_the_device(name, tmp_path):
    results = {}
    for device in ("cpu", DEVICE):
        out = CliRunner().invoke(main, ["run", "--defense", name, "--attack", "none", "--epochs", "2", "--device",
                                        device, "--quiet", "--json", "--results", str(tmp_path / device)])
        assert out.exit_code == 0, out.output
        results[device] = json.loads(out.stdout)
    got, cpu = results[DEVICE], results["cpu"]
    assert got["device"].startswith(DEVICE)
    assert got["privacy.epsilon"] == cpu["privacy.epsilon"] and got["privacy.noise_multiplier"] == \
        cpu["privacy.noise_multiplier"]
    assert got["utility.test_accuracy"] > 0.3  # digits: chance is 0.1
    assert abs(got["utility.test_accuracy"] - cpu["utility.test_accuracy"]) < 0.15  # other noise draws, same recipe


def test_an_interrupted_cuda_run_resumes_where_an_uninterrupted_one_ends(tmp_path, monkeypatch):
    def command(results):
        return ["run", "--defense", "rs", "--attack", "none", "--epochs", "3", "--device", DEVICE, "--set",
                "train.batch_size=256", "--quiet", "--json", "--results", str(results)]

    reference = CliRunner().invoke(main, command(tmp_path / "ref"))
    assert reference.exit_code == 0, reference.output
    interrupt_at(monkeypatch, 7)  # digits: 4 steps an epoch, so in the second epoch
    assert CliRunner().invoke(main, command(tmp_path / "r")).exit_code == 130
    resumed = CliRunner().invoke(main, command(tmp_path / "r"))
    assert resumed.exit_code == 0, resumed.output
    assert "resuming run" in resumed.stderr and "after epoch 1" in resumed.stderr
    got, expected = json.loads(resumed.stdout), json.loads(reference.stdout)
    assert got["privacy.epsilon"] == expected["privacy.epsilon"]
    assert abs(got["utility.test_accuracy"] - expected["utility.test_accuracy"]) <= 0.01
    assert comparable(got).keys() == comparable(expected).keys()
    a, b = model_of(tmp_path / "r", got["run_id"]), model_of(tmp_path / "ref", expected["run_id"])
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-3, atol=1e-4)


def test_lean_matches_the_torch_func_path_on_the_device():
    model = build_model("resnet20-gn", (3, 8, 8), 10, (0.5,) * 3, (0.25,) * 3).to(DEVICE)
    x, y = torch.randn(5, 3, 8, 8, device=DEVICE), torch.randint(0, 10, (5,), device=DEVICE)
    names = [n for n, p in model.named_parameters()]
    grads = PerSampleGradients(model)(x, y)
    for spec in ("all", "layer"):
        clipping = GroupClipping.of(resolve_groups(spec, names), 1.0, "auto")
        ref, got = clipping.clip_sum(grads), LeanEngine(model)(x, y, clipping.plan()).sums
        for n in names:
            assert got[n].device.type == torch.device(DEVICE).type
            assert float((ref[n] - got[n]).abs().max() / ref[n].abs().max().clamp(min=1e-12)) < 1e-4, (spec, n)


def test_bf16_on_the_device_clips_exactly_and_trains(tmp_path):
    """train.precision bf16 on the device: float32 per-sample gradients within 35 % of float32's, each clipped
    contribution within C·(1 ± 1e-5); a short digits run in bf16 learns about as well as its float32 twin.

    The bound is this model's measured bf16 error, not a guess: the largest relative error over 16 samples of the
    untrained ResNet-20-GN has median 0.20, 90th percentile 0.26 and maximum 0.28 over 40 batches (10 seeds,
    CPU autocast), and perturbing the float32 weights by bf16's unit roundoff (relative 2⁻⁹) moves the gradients
    as much (median 0.12, max 0.23): the gradients are that sensitive to rounding, and 0.2158 on an H200 is one
    draw of that distribution (docs/performance.md, "bfloat16"). The lower bound checks that bf16 is in effect."""
    prep = prepared("dpsgd", {}, "resnet20-gn", DEVICE)
    x, y = prep.task.train.x[:16].to(DEVICE), prep.task.train.y[:16].to(DEVICE)
    grads = PerSampleGradients(prep.model, precision="bf16")(x, y)
    g32, g16 = flat_rows(PerSampleGradients(prep.model)(x, y)), flat_rows(grads)
    error = ((g16 - g32).norm(dim=1) / g32.norm(dim=1)).max()
    assert 1e-4 < error < 0.35
    clip = 0.01 * float(g16.norm(dim=1).min())  # every example clipped
    for i in range(len(y)):
        defense = DPSGD(ClipParams(clip=clip), DefenseContext({n: q.shape for n, q in prep.model.named_parameters()},
                                                                   0.0, Streams(0), DEVICE))
        defense.clip_and_accumulate({n: g[i:i + 1] for n, g in grads.items()})
        norm = float(flat(defense.release(1).grads, DEVICE).norm())
        assert clip * (1 - 1e-5) <= norm <= clip * (1 + 1e-5)
    accuracy = {}
    for precision in ("fp32", "bf16"):
        out = CliRunner().invoke(main, ["run", "--attack", "none", "--epochs", "4", "--device", DEVICE, "--quiet",
                                        "--json", "--set", f"train.precision={precision}", "--results",
                                        str(tmp_path / precision)])
        assert out.exit_code == 0, out.output
        record = json.loads(out.stdout)
        assert record["train.engine_used"] == "func" or precision == "fp32"  # bf16: func only
        accuracy[precision] = record["utility.test_accuracy"]
    assert accuracy["fp32"] > 0.3 and accuracy["bf16"] > accuracy["fp32"] - 0.1


def flat_rows(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per-sample gradients as rows [b, d], float64 on the CPU."""
    return torch.cat([g.detach().flatten(1).double().cpu() for g in grads.values()], dim=1)

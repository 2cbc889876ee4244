"""The lean per-sample engine (``train.engine=lean``): agreement with the torch.func reference,
the clipping bound it enforces, memory (layers held at once), refusals and engine selection."""

import dataclasses
import json

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from dpeval.cli import main
from dpeval.core.errors import ConfigError, RunFailure
from dpeval.core.models import build_model
from dpeval.core.per_sample import PerSampleGradients
from dpeval.core.streams import Streams, seed_globals
from dpeval.defenses import DEFENSES
from dpeval.defenses.base import DefenseContext
from dpeval.defenses.clipping import GroupClipping
from dpeval.defenses.dpsgd import DPSGD, ClipParams
from dpeval.defenses.groupwise import resolve_groups
from dpeval.engine.lean import LeanEngine, engine_choice, trainable_layers
from dpeval.engine.training import train
from dpeval.runner import prepare
from tests.helpers import spec_for


# -- agreement with the torch.func reference -------------------------------------------------------------
class TokenNet(nn.Module):
    """Linear layers on [b, T, d] inputs (ghost norm for few tokens, instantiation for many) and LayerNorm."""

    def __init__(self, tokens: int) -> None:
        super().__init__()
        self.tokens = tokens
        self.embed = nn.Linear(8, 6)
        self.norm = nn.LayerNorm(6)
        self.mix = nn.Linear(6, 40, bias=False)
        self.head = nn.Linear(40, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(x.shape[0], self.tokens, 8)
        return self.head(torch.tanh(self.mix(self.norm(self.embed(h)))).mean(1))


class DilatedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=2, dilation=2)
        self.gn = nn.GroupNorm(2, 4)
        self.fc = nn.Linear(4 * 5 * 5, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.gn(self.conv(x))).flatten(1))


CASES = {
    "cnn3": (lambda: build_model("cnn3", (1, 8, 8), 10, (0.5,), (0.25,)), (1, 8, 8)),
    "dpcnn-small": (lambda: build_model("dpcnn-small", (3, 32, 32), 10, (0.5,) * 3, (0.25,) * 3), (3, 32, 32)),
    "resnet20-gn": (lambda: build_model("resnet20-gn", (3, 8, 8), 10, (0.5,) * 3, (0.25,) * 3), (3, 8, 8)),
    "dpcnn": (lambda: build_model("dpcnn", (3, 16, 16), 10, (0.5,) * 3, (0.25,) * 3), (3, 16, 16)),
    "tokens-ghost": (lambda: TokenNet(2), (2, 8)),
    "tokens-instantiated": (lambda: TokenNet(12), (12, 8)),
    "dilated-conv-groupnorm": (lambda: DilatedNet(), (3, 9, 9)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_lean_matches_the_torch_func_path(case):
    assert_matches_torch_func(case)


def assert_matches_torch_func(case: str) -> None:
    build, shape = CASES[case]
    torch.manual_seed(0)
    model = build()
    x, y = torch.randn(5, *shape), torch.randint(0, 10, (5,))
    names = [n for n, p in model.named_parameters()]
    grads = PerSampleGradients(model)(x, y)
    for spec in ("all", "layer", "param", "uniform:2"):
        for fn in ("auto", "abadi"):
            clipping = GroupClipping.of(resolve_groups(spec, names), 0.3 if fn == "abadi" else 1.0, fn)
            ref, got = clipping.clip_sum(grads), LeanEngine(model)(x, y, clipping.plan()).sums
            for n in names:
                scale = ref[n].abs().max().clamp(min=1e-12)
                assert float((ref[n] - got[n]).abs().max() / scale) < 1e-5, (case, spec, fn, n)


@pytest.mark.parametrize("case", ["cnn3", "resnet20-gn", "dpcnn", "dilated-conv-groupnorm"])
def test_the_cuda_conv_path_matches_the_torch_func_path(case, monkeypatch):
    """What a CUDA device runs — convolution weight gradients by one batched product, chunks of the device's
    budget — forced on the CPU: the same sums as torch.func, every conv's micro-batch in one chunk."""
    from dpeval.engine import lean

    chunks = []

    def by_matmul(self, module, a, ds):
        chunks.append(a.shape[0])
        return self.weight_grads_by_matmul(module, a, ds)

    monkeypatch.setattr(lean.Conv2dKernel, "weight_grads", by_matmul)
    monkeypatch.setattr(lean, "workspace_budget", lambda device: 1 << 30)
    assert_matches_torch_func(case)
    assert chunks and set(chunks) == {5}


@pytest.mark.parametrize("stride,padding,dilation,kernel", [(1, 0, 1, 3), (2, (1, 2), 2, (3, 2)), (3, 1, 1, 1)])
def test_both_conv_weight_gradient_kernels_equal_autograd_per_sample(stride, padding, dilation, kernel):
    from dpeval.engine.lean import Conv2dKernel

    torch.manual_seed(0)
    conv = nn.Conv2d(3, 5, kernel, stride=stride, padding=padding, dilation=dilation).double()
    a = torch.randn(4, 3, 11, 9, dtype=torch.float64)
    ds = torch.randn_like(conv(a))
    expected = torch.stack([torch.autograd.grad((conv(a[i:i + 1]) * ds[i:i + 1]).sum(), conv.weight)[0]
                            for i in range(4)])
    for method in (Conv2dKernel().weight_grads_by_matmul, Conv2dKernel().weight_grads_by_grouped_conv):
        torch.testing.assert_close(method(conv, a, ds), expected, rtol=1e-10, atol=1e-12)


def test_the_workspace_budget_is_8_mib_on_the_cpu_and_a_share_of_a_cuda_devices_memory(monkeypatch):
    from dpeval.engine import lean

    assert lean.workspace_budget(torch.device("cpu")) == 1 << 21
    monkeypatch.setattr(lean, "_cuda_memory", lambda index: 2**37 if index == 1 else 0)
    assert lean.workspace_budget(torch.device("cuda", 1)) == int(2**37 * lean.CUDA_WORKSPACE_SHARE) // 4


def test_finer_groups_hold_fewer_layers_at_once():
    model = build_model("dpcnn", (3, 16, 16), 10, (0.5,) * 3, (0.25,) * 3)  # 8 layers
    names = [n for n, p in model.named_parameters()]
    x, y = torch.randn(3, 3, 16, 16), torch.randint(0, 10, (3,))
    held = {}
    for spec in ("all", "uniform:2", "layer", "param"):
        bk = LeanEngine(model)
        bk(x, y, GroupClipping.of(resolve_groups(spec, names), 1.0, "auto").plan())
        held[spec] = bk.peak_held
    assert held == {"all": 8, "uniform:2": 4, "layer": 1, "param": 1}


def test_micro_batches_add_up_to_the_whole_batch():
    model = build_model("cnn3", (1, 8, 8), 10, (0.5,), (0.25,))
    names = [n for n, p in model.named_parameters()]
    plan = GroupClipping.of(resolve_groups("layer", names), 1.0, "auto").plan()
    bk = LeanEngine(model)
    x, y = torch.randn(12, 1, 8, 8), torch.randint(0, 10, (12,))
    whole, a, b = (bk(x, y, plan).sums, bk(x[:5], y[:5], plan).sums, bk(x[5:], y[5:], plan).sums)
    for n in names:
        torch.testing.assert_close(whole[n], a[n] + b[n], rtol=1e-5, atol=1e-6)


# -- refusals: never drop a parameter silently ------------------------------------------------------------
class WithEmbedding(nn.Module):
    """An embedding the engine does not support (padding_idx) and a bare parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4, padding_idx=0)
        self.scale = nn.Parameter(torch.ones(4))
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb(x).mean(1) * self.scale)


def test_unsupported_parameters_are_named():
    with pytest.raises(ConfigError) as err:
        trainable_layers(WithEmbedding())
    message = str(err.value)
    assert "Embedding (this configuration) ×1 at emb" in message and "Parameter (bare, in WithEmbedding) ×1 at scale" \
        in message and "Linear" not in message.split("(it knows")[0]


def test_a_layer_used_twice_is_refused():
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(torch.tanh(self.fc(x)))

    model = Twice()
    with pytest.raises(RunFailure, match="more than once"):
        LeanEngine(model)(torch.randn(3, 4), torch.randint(0, 4, (3,)),
                           GroupClipping.of([["fc.weight", "fc.bias"]], 1.0, "auto").plan())


def test_engine_selection():
    model = build_model("cnn3", (1, 8, 8), 10, (0.5,), (0.25,))
    shapes = {n: p.shape for n, p in model.named_parameters()}
    streams = Streams(0)
    dp = DPSGD(ClipParams(), DefenseContext(shapes, 1.0, streams))

    class Materialised(DPSGD):  # a defense that declares no lean plan
        capabilities = dataclasses.replace(DPSGD.capabilities, lean_capable=False)

    plain = Materialised(ClipParams(), DefenseContext(shapes, 1.0, streams))
    assert engine_choice("auto", model, dp)[0] == "lean"
    assert engine_choice("func", model, dp)[0] == "func"
    assert engine_choice("auto", model, plain)[0] == "func"
    with pytest.raises(ConfigError, match="train.engine"):
        engine_choice("lean", model, plain)
    embedding = WithEmbedding()
    dp_emb = DPSGD(ClipParams(), DefenseContext({n: p.shape for n, p in embedding.named_parameters()}, 1.0, streams))
    assert engine_choice("auto", embedding, dp_emb)[0] == "func"
    with pytest.raises(ConfigError, match=r"Parameter \(bare, in WithEmbedding\) ×1 at scale, Embedding .*×1 at emb"):
        engine_choice("lean", embedding, dp_emb)


def test_auto_materialises_on_cuda_where_a_micro_batch_of_per_sample_gradients_fits(monkeypatch):
    """On a CUDA device ``auto`` picks ``func`` (faster there) while one micro-batch of per-sample gradients takes
    at most a quarter of the device's memory; ``lean`` beyond that, and always on the CPU."""
    from types import SimpleNamespace

    from dpeval.engine import lean

    model = build_model("cnn3", (1, 8, 8), 10, (0.5,), (0.25,))
    shapes = {n: p.shape for n, p in model.named_parameters()}
    dp = DPSGD(ClipParams(), DefenseContext(shapes, 1.0, Streams(0)))
    per_example = 4 * sum(p.numel() for p in model.parameters())
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=2**30))
    fits = int(lean.FUNC_SHARE_ON_CUDA * 2**30) // per_example
    assert engine_choice("auto", model, dp, "cuda", fits)[0] == "func"
    assert engine_choice("auto", model, dp, "cuda", fits + 1)[0] == "lean"
    assert engine_choice("lean", model, dp, "cuda", 1)[0] == "lean"  # asked for: kept
    assert engine_choice("auto", model, dp, "cpu", 1)[0] == "lean"


def test_every_defense_runs_lean_by_default(tmp_path):
    for name in DEFENSES.names():
        result = CliRunner().invoke(main, ["run", "--defense", name, "--attack", "none", "--epochs", "1",
                                           "--results", str(tmp_path), "--json", "--quiet"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["train.engine_used"] == "lean", name


# -- the engines train alike; the clipping bound ----------------------------------------------------------
def test_lean_and_func_training_agree():
    """Both engines train the same model to float rounding over a short run (same batches and noise)."""
    results = {}
    for engine in ("func", "lean"):
        spec = spec_for("groupwise", defense__groups="uniform:2", train__epochs=1, train__batch_size=64,
                        train__engine=engine, train__lr=0.001, seed=2)
        prep = prepare(spec)
        seed_globals(prep.streams)  # as the runner does before training
        out = train(prep.model, prep.task.train, prep.task.test, prep.make_defense(prep.streams.scope("victim")),
                    spec.train, prep.sampler, prep.device, progress=False)
        assert out.engine == engine
        results[engine] = torch.cat([p.detach().reshape(-1) for p in prep.model.parameters()])
    torch.testing.assert_close(results["func"], results["lean"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("spec", ["all", "uniform:2", "layer", "param"])
@pytest.mark.parametrize("fn", ["auto", "abadi"])
def test_lean_bounds_one_samples_contribution(spec, fn):
    """Add/remove one (adversarially large) example: the lean engine's clipped sum moves by at most R,
    and by at most R/√M within each group — the sensitivity the noise is calibrated to."""
    model = build_model("dpcnn-small", (3, 32, 32), 10, (0.5,) * 3, (0.25,) * 3)
    names = [n for n, p in model.named_parameters()]
    clipping = GroupClipping.of(resolve_groups(spec, names), 0.8, fn)
    bk = LeanEngine(model)
    torch.manual_seed(1)
    x, y = torch.rand(6, 3, 32, 32), torch.randint(0, 10, (6,))
    x[0] = x[0] * 1e3 - 5e2  # a huge-gradient canary example
    raw = PerSampleGradients(model)(x[:1], y[:1])
    assert float(torch.cat([g.reshape(-1) for g in raw.values()]).norm()) > 10 * 0.8  # really needs clipping
    with_it, without = bk(x, y, clipping.plan()).sums, bk(x[1:], y[1:], clipping.plan()).sums
    diff = {n: with_it[n] - without[n] for n in names}
    slack = 1 + 1e-5
    assert float(torch.cat([d.reshape(-1) for d in diff.values()]).norm()) <= 0.8 * slack
    for group in clipping.groups:
        assert float(torch.cat([diff[n].reshape(-1) for n in group]).norm()) <= clipping.threshold * slack


@pytest.mark.parametrize("shifted,scaled", [(True, True), (True, False), (False, True)])
def test_one_token_linear_statistic_equals_the_instantiated_one(shifted, scaled):
    """‖(ds_i a_iᵀ − m) ⊙ s‖² in closed form (no per-sample gradient) equals the explicit computation."""
    from dpeval.engine.lean import _one_token_linear

    gen = torch.Generator().manual_seed(0)
    a, ds = torch.randn(7, 5, generator=gen), torch.randn(7, 3, generator=gen)
    shift = torch.randn(3, 5, generator=gen) if shifted else None
    scale = torch.rand(3, 5, generator=gen) + 0.5 if scaled else None
    g = ds[:, :, None].double() * a[:, None, :].double()
    w = (g - (shift.double() if shifted else 0)) * (scale.double() if scaled else 1)
    torch.testing.assert_close(_one_token_linear(a, ds, shift, scale), w.pow(2).sum((1, 2)), rtol=1e-12, atol=1e-12)


# -- the kernel table: every entry against torch.func, with clipping active ---------------------------------
class OneLayerNet(nn.Module):
    """The layer under test between a fixed input map and a small Linear head (the head's own kernel is
    tested by the Linear case)."""

    def __init__(self, layer: nn.Module, reshape) -> None:
        super().__init__()
        self.layer, self.reshape = layer, reshape
        self.head = nn.LazyLinear(10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.reshape(x)
        if isinstance(self.layer, nn.MultiheadAttention):  # self-attention: (output, weights)
            h = self.layer(h, h, h, need_weights=False)[0]
        else:
            h = self.layer(h)
        return self.head(torch.tanh(h).flatten(1))


KERNEL_CASES = {
    nn.Linear: (lambda: nn.Linear(12, 7), lambda x: x.reshape(x.shape[0], 3, 12), (36,)),  # 3 tokens
    nn.Conv2d: (lambda: nn.Conv2d(2, 3, 3, stride=2, padding=1), lambda x: x, (2, 7, 7)),
    nn.GroupNorm: (lambda: nn.GroupNorm(2, 4), lambda x: x, (4, 3, 3)),
    nn.LayerNorm: (lambda: nn.LayerNorm(6), lambda x: x.reshape(x.shape[0], 4, 6), (24,)),
    nn.Embedding: (lambda: nn.Embedding(5, 6), lambda x: token_ids(x, 5), (8,)),  # 8 tokens of 5: repeats
    nn.MultiheadAttention: (lambda: nn.MultiheadAttention(6, 2, batch_first=True), lambda x: x.reshape(-1, 4, 6),
                            (24,)),  # in_proj a Linear over 4 tokens; out_proj a Linear called by the kernel
}


def token_ids(x: torch.Tensor, vocab: int) -> torch.Tensor:
    """Token ids in [0, vocab) from a float input (the graph stops here, as in a token model)."""
    return (x.abs() * vocab).long().remainder(vocab)


def test_every_kernel_of_the_table_has_an_exactness_case():
    from dpeval.engine.lean import KERNELS

    assert {t for t in KERNELS if t.__module__.startswith("torch.")} == set(KERNEL_CASES)  # tests add their own


@pytest.mark.parametrize("layer_type", list(KERNEL_CASES), ids=lambda t: t.__name__)
def test_each_kernel_matches_torch_func_with_clipping_active(layer_type):
    check_layer_against_torch_func(*KERNEL_CASES[layer_type])


# Linear and Embedding on T tokens through both norm branches of FastDP's rule (2T² < p·d: ghost norm)
BRANCH_CASES = {
    "linear-ghost": (lambda: nn.Linear(12, 7), lambda x: x.reshape(x.shape[0], 3, 12), (36,), True),
    "linear-instantiated": (lambda: nn.Linear(3, 2), lambda x: x.reshape(x.shape[0], 6, 2, 3), (36,), False),
    "embedding-ghost": (lambda: nn.Embedding(40, 8), lambda x: token_ids(x, 40), (6,), True),
    "embedding-instantiated": (lambda: nn.Embedding(4, 3), lambda x: token_ids(x, 4).reshape(-1, 3, 3), (9,),
                               False),
}


@pytest.mark.parametrize("case", list(BRANCH_CASES))
def test_token_layers_are_exact_on_both_sides_of_the_ghost_norm_rule(case, monkeypatch):
    from dpeval.engine import lean

    build, reshape, shape, ghost = BRANCH_CASES[case]
    decisions = []
    rule = lean.ghost_norm_pays
    monkeypatch.setattr(lean, "ghost_norm_pays", lambda t, n: decisions.append(rule(t, n)) or rule(t, n))
    check_layer_against_torch_func(build, reshape, shape)
    assert decisions and decisions[0] == ghost  # the layer under test is the first weight layer backprop meets last


def test_the_ghost_norm_rule_is_fastdps():
    from dpeval.engine.lean import ghost_norm_pays

    assert ghost_norm_pays(3, 84) and not ghost_norm_pays(6, 72) and not ghost_norm_pays(1, 2)
    assert ghost_norm_pays(128, 768 * 768) and not ghost_norm_pays(512, 768 * 768 // 2)


def test_an_embedding_with_padding_idx_is_refused_by_name():
    model = nn.Sequential(nn.Embedding(10, 4, padding_idx=0), nn.Flatten(), nn.Linear(8, 2))
    with pytest.raises(ConfigError, match=r"Embedding \(this configuration\) ×1 at 0;"):
        trainable_layers(model)


def check_layer_against_torch_func(build, reshape, shape):
    torch.manual_seed(1)
    model = OneLayerNet(build(), reshape)
    x, y = torch.randn(8, *shape), torch.randint(0, 10, (8,))
    model(x)  # materialise the lazy head
    for p in model.layer.parameters():  # non-trivial affine parameters for the norm layers
        p.data.normal_()
    names = [n for n, _ in model.named_parameters()]
    grads = PerSampleGradients(model)(x, y)
    layer_norms = torch.stack([grads[n].flatten(1).norm(dim=1) for n in names if n.startswith("layer.")]).norm(dim=0)
    for spec in ("all", "layer", "param"):
        clip = 0.5 * float(layer_norms.median())  # at least half the samples are clipped in the layer's group
        clipping = GroupClipping.of(resolve_groups(spec, names), clip, "abadi")
        plan = clipping.plan()
        ref, got = clipping.clip_sum(grads), LeanEngine(model)(x, y, plan)
        for n in names:
            scale = ref[n].abs().max().clamp(min=1e-12)
            assert float((ref[n] - got.sums[n]).abs().max() / scale) < 1e-5, (spec, n)
        assert any(float((f < 1).float().mean()) >= 0.5 for f in got.factors), spec  # clipping was active


# -- the transformers end to end: every layer type together, float64, clipping active --------------------------
@pytest.mark.parametrize("name", ["vit", "gpt"])
def test_transformers_match_torch_func_with_clipping_active(name):
    from dpeval.core.settings import ModelConfig

    torch.manual_seed(0)
    settings = ModelConfig(width=16, heads=2)
    if name == "vit":
        model, x = build_model("vit", (1, 8, 8), 4, (0.5,), (0.25,), settings), torch.rand(6, 1, 8, 8)
    else:
        model = build_model("gpt", (1, 1, 10), 4, (0.0,), (1.0,), settings, 7)
        x = torch.randint(0, 7, (6, 1, 1, 10)).float()
    model, x, y = model.double(), x.double(), torch.randint(0, 4, (6,))
    names = [n for n, _ in model.named_parameters()]
    grads = PerSampleGradients(model)(x, y)
    trainable_layers(model)  # every layer is in the kernel table
    for spec in ("all", "layer", "param", "uniform:2", "boundary:1"):
        for fn in ("auto", "abadi"):
            clipping = GroupClipping.of(resolve_groups(spec, names), 0.05, fn)
            ref, got = clipping.clip_sum(grads), LeanEngine(model)(x, y, clipping.plan())
            for n in names:
                assert float((ref[n] - got.sums[n]).abs().max() / ref[n].abs().max()) < 1e-9, (spec, fn, n)
            if fn == "abadi":
                assert all(float((f < 1).float().mean()) >= 0.5 for f in got.factors), spec  # clipping is active

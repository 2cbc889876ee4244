"""The lean engine's kernels for grouped convolutions, multi-head attention and bare parameters (declared to
broadcast over the samples, or served by ``FuncKernel`` on their owner), each against torch.func's per-sample
gradients in float64 under every kind of lean plan (clip groups; a mask; a shift and scale; probes); and the
refusals that keep anything else from being mis-clipped."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpeval.core.errors import ConfigError, RunFailure
from dpeval.core.per_sample import PerSampleGradients
from dpeval.defenses.lean_plan import LeanPlan
from dpeval.engine.lean import Conv2dKernel, FuncKernel, LeanEngine, install, lean_parts, register_broadcast


def factors(group: int, squares: torch.Tensor, probes: torch.Tensor | None) -> torch.Tensor:
    """Abadi-style factors that depend on every statistic (and on the probes, as GEP's residual does)."""
    if probes is not None:
        squares = (squares - probes.pow(2).sum(1)).clamp(min=0)
    return (0.5 / squares.sqrt().clamp(min=1e-12)).clamp(max=1.0)


def plans(names: list[str], shapes: dict[str, torch.Size], gen: torch.Generator) -> dict[str, LeanPlan]:
    """One plan of each kind the engine serves, over ``names``."""
    dt = torch.float64
    masks = {n: (torch.rand(shapes[n], generator=gen) < 0.6).to(dt) for n in names}
    shift = {n: 1e-2 * torch.randn(shapes[n], generator=gen, dtype=dt) for n in names}
    scale = {n: torch.rand(shapes[n], generator=gen, dtype=dt) + 0.5 for n in names}
    blocks, col = {}, 0
    for n in names:
        size = shapes[n].numel()
        blocks[n] = [(0, size, col, torch.randn(size, 2, generator=gen, dtype=dt) / size ** 0.5)]
        col += 2
    return {"layer-groups": LeanPlan(tuple((n,) for n in names), factors),
            "one-group": LeanPlan((tuple(names),), factors),
            "mask": LeanPlan((tuple(names),), factors, scale=masks),
            "shift-scale": LeanPlan((tuple(names[::2]), tuple(names[1::2])) if len(names) > 1 else (tuple(names),),
                                    factors, shift=shift, scale=scale),
            "probes": LeanPlan((tuple(names),), factors, probes=blocks, probe_dim=col)}


def reference(grads: dict[str, torch.Tensor], plan: LeanPlan) -> tuple[dict, list]:
    """The plan's sums and factors from materialised per-sample gradients."""
    b = next(iter(grads.values())).shape[0]
    probes = torch.zeros(b, plan.probe_dim, dtype=torch.float64) if plan.probes else None
    for n, blocks in plan.probes.items():
        for lo, hi, col, v in blocks:
            probes[:, col:col + v.shape[1]] += grads[n].flatten(1)[:, lo:hi] @ v
    sums, cs = {}, []
    for m, group in enumerate(plan.groups):
        squares = sum(((grads[n] - plan.shift.get(n, 0)) * plan.scale.get(n, 1)).flatten(1).pow(2).sum(1)
                      for n in group)
        c = factors(m, squares, probes)
        cs.append(c)
        sums.update({n: torch.einsum("b,b...->...", c, grads[n]) for n in group})
    return sums, cs


def check_every_plan(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    model = model.double()
    x = x.double() if x.is_floating_point() else x
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    shapes = {n: p.shape for n, p in model.named_parameters()}
    grads = {n: g.double() for n, g in PerSampleGradients(model)(x, y).items()}
    engine = LeanEngine(model)
    for kind, plan in plans(names, shapes, torch.Generator().manual_seed(0)).items():
        ref, c_ref = reference(grads, plan)
        got = engine(x, y, plan)
        assert any(float((c < 1).float().mean()) > 0 for c in c_ref), kind  # clipping is active
        for c, c_got in zip(c_ref, got.factors):
            torch.testing.assert_close(c_got.double(), c, rtol=1e-7, atol=1e-12)
        for n in names:
            err = float((ref[n] - got.sums[n]).abs().max() / ref[n].abs().max().clamp(min=1e-30))
            assert err < 1e-7, (kind, n, err)


# -- grouped and depthwise convolutions -------------------------------------------------------------------------
@pytest.mark.parametrize("cin,cout,groups,stride,kernel_size,size",
                         [(4, 6, 2, 1, 3, 7), (6, 6, 6, 2, 3, 7), (3, 6, 3, 1, 3, 7), (4, 8, 4, 2, 3, 7),
                          (4, 4, 4, 1, 5, 2), (3, 6, 3, 2, 5, 3), (4, 4, 4, 1, 3, 1)],
                         ids=["grouped", "depthwise", "depthwise-x2", "depthwise-x2-strided", "depthwise-5x5-on-2x2",
                              "depthwise-x2-5x5-on-3x3-strided", "depthwise-3x3-on-1x1"])
def test_every_grouped_conv_weight_gradient_kernel_equals_autograd_per_sample(cin, cout, groups, stride, kernel_size,
                                                                              size):
    torch.manual_seed(0)
    conv = nn.Conv2d(cin, cout, kernel_size, stride=stride, padding=kernel_size // 2, groups=groups).double()
    a = torch.randn(3, cin, size, size + 1, dtype=torch.float64)
    ds = torch.randn_like(conv(a))
    expected = torch.stack([torch.autograd.grad((conv(a[i:i + 1]) * ds[i:i + 1]).sum(), conv.weight)[0]
                            for i in range(3)])
    kernel = Conv2dKernel()
    methods = [kernel.weight_grads_by_matmul, kernel.weight_grads_by_grouped_conv, kernel.weight_grads]
    if groups == cin:
        methods.append(kernel.weight_grads_by_taps)
    for method in methods:
        torch.testing.assert_close(method(conv, a, ds), expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(kernel.weight_sum(conv, a, ds), expected.sum(0), rtol=1e-10, atol=1e-12)
    skipped = len(kernel.taps(conv, a, ds)) < kernel_size ** 2
    assert skipped == (size <= 2), "offsets reading only padding: on the two smallest maps"


class GroupedConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 6, 3, padding=1), nn.Tanh(),
            nn.Conv2d(6, 6, 3, padding=1, groups=6), nn.GroupNorm(2, 6), nn.Tanh(),   # depthwise
            nn.Conv2d(6, 12, 3, stride=2, groups=6), nn.Tanh(),                       # channel multiplier 2
            nn.Conv2d(12, 8, 1, groups=4, bias=False), nn.Tanh())                     # grouped pointwise
        self.head = nn.Linear(8 * 3 * 3, 5)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def test_grouped_and_depthwise_convs_match_torch_func_under_every_plan():
    torch.manual_seed(0)
    check_every_plan(GroupedConvNet(), torch.randn(5, 3, 8, 8), torch.randint(0, 5, (5,)))


# -- multi-head attention ----------------------------------------------------------------------------------------
class AttentionNet(nn.Module):
    def __init__(self, batch_first: bool, causal: bool) -> None:
        super().__init__()
        self.batch_first, self.causal = batch_first, causal
        self.embed = nn.Linear(4, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=batch_first)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.embed(x.reshape(len(x), 5, 4))
        if not self.batch_first:
            h = h.transpose(0, 1)
        mask = torch.ones(5, 5, dtype=torch.bool).triu(1) if self.causal else None
        out, weights = self.attn(h, h, h, attn_mask=mask)
        if not self.batch_first:
            out = out.transpose(0, 1)
        return self.head(out.mean(1)) + weights.sum((1, 2))[:, None]  # the averaged weights are used too


@pytest.mark.parametrize("batch_first,causal", [(True, False), (False, True)])
def test_multihead_attention_matches_torch_func_under_every_plan(batch_first, causal):
    torch.manual_seed(0)
    check_every_plan(AttentionNet(batch_first, causal), torch.randn(6, 20), torch.randint(0, 3, (6,)))


def test_the_attention_kernel_computes_torchs_function():
    torch.manual_seed(0)
    model = AttentionNet(False, True).double()
    x = torch.randn(4, 20, dtype=torch.float64)
    expected = model(x)
    seen = []
    engine = LeanEngine(model)
    names = tuple(n for n, _ in model.named_parameters())
    engine(x, torch.zeros(4, dtype=torch.long), LeanPlan((names,), lambda m, s, p: seen.append(s) or s * 0 + 1))
    assert not hasattr(model.attn, "forward") or "forward" not in vars(model.attn)  # its own forward given back
    torch.testing.assert_close(model(x), expected)


def test_cross_attention_is_refused_when_it_runs():
    class Cross(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(4, 1, batch_first=True)

        def forward(self, x):
            h = x.reshape(len(x), 2, 4)
            return self.attn(h, h.flip(1), h)[0].sum(1)

    model = Cross()
    names = tuple(n for n, _ in model.named_parameters())
    with pytest.raises(RunFailure, match="self-attention"):
        LeanEngine(model)(torch.randn(3, 8), torch.zeros(3, dtype=torch.long), LeanPlan((names,), factors))


# -- bare parameters --------------------------------------------------------------------------------------------
class LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        return x * self.gamma


class Block(nn.Module):
    """A block with a bare layer scale beside its children, and attention logits biased by a table indexed by a
    buffer (as Swin's and LeViT's)."""

    def __init__(self, dim: int, tokens: int) -> None:
        super().__init__()
        self.qk = nn.Linear(dim, 2 * dim)
        self.mlp = nn.Linear(dim, dim)
        self.table = nn.Parameter(torch.randn(2 * tokens - 1))
        self.register_buffer("index", torch.arange(tokens)[:, None] - torch.arange(tokens)[None, :] + tokens - 1)
        self.gamma = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        q, k = self.qk(x).chunk(2, -1)
        weights = (q @ k.transpose(1, 2) + self.table[self.index]).softmax(-1)
        return x + self.gamma * self.mlp(weights @ x)


class TinyViT(nn.Module):
    def __init__(self, dim: int = 6, tokens: int = 4) -> None:
        super().__init__()
        self.patch = nn.Linear(3, dim)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, tokens + 1, dim))
        self.block = Block(dim, tokens + 1)
        self.scale = LayerScale(dim)
        self.head = nn.Linear(dim, 4)

    def forward(self, x):
        h = self.patch(x.reshape(len(x), -1, 3))
        h = torch.cat([self.cls_token.expand(len(x), -1, -1), h], 1) + self.pos_embed
        return self.head(self.scale(self.block(h))[:, 0])


register_broadcast(TinyViT, "cls_token", "pos_embed")
install(Block, FuncKernel())
install(LayerScale, FuncKernel())


def test_bare_parameters_match_torch_func_under_every_plan():
    torch.manual_seed(0)
    model = TinyViT()
    layers, bare = lean_parts(model)
    assert set(bare) == {"cls_token", "pos_embed"} and {"block", "scale", "block.qk", "block.mlp"} <= set(layers)
    check_every_plan(model, torch.randn(6, 12), torch.randint(0, 4, (6,)))


class SubtreeAttention(nn.Module):
    """Uses its child's weights without calling it (as torchvision's Swin attention does)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(4, 12)
        self.bias = nn.Parameter(torch.randn(3))

    def forward(self, x):
        q, k, v = F.linear(x, self.qkv.weight, self.qkv.bias).chunk(3, -1)
        return (q @ k.transpose(1, 2) + self.bias[:, None]).softmax(-1) @ v


install(SubtreeAttention, FuncKernel(subtree=True))


def test_a_subtree_kernel_serves_weights_used_without_calling_their_module():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Unflatten(1, (3, 4)), SubtreeAttention(), nn.Flatten(), nn.Linear(12, 3))
    assert set(lean_parts(model)[0]) == {"1", "3"}  # 1.qkv is the subtree kernel's
    check_every_plan(model, torch.randn(5, 12), torch.randint(0, 3, (5,)))


def test_an_undeclared_bare_parameter_is_refused_and_a_declared_one_needs_a_leading_one():
    class Undeclared(TinyViT):
        pass

    with pytest.raises(ConfigError, match=r"Parameter \(bare, in Undeclared\) ×2 at cls_token, …"):
        lean_parts(Undeclared())

    class Wide(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pos = nn.Parameter(torch.zeros(3, 4))
            self.head = nn.Linear(4, 2)

        def forward(self, x):
            return self.head(x.reshape(len(x), 3, 4) + self.pos).sum(1)

    register_broadcast(Wide, "pos")
    with pytest.raises(ConfigError, match=r"Parameter \(bare, in Wide\) ×1 at pos"):
        lean_parts(Wide())


def test_a_batch_folded_into_another_dimension_is_refused_when_it_runs():
    class Folded(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.norm = nn.LayerNorm(4)

        def forward(self, x):
            h = self.fc(x.reshape(len(x), 2, 4))
            return self.norm(h.flatten(0, 1)).reshape(len(x), -1)

    model = Folded()
    names = tuple(n for n, _ in model.named_parameters())
    with pytest.raises(RunFailure, match="first dimension"):
        LeanEngine(model)(torch.randn(3, 8), torch.zeros(3, dtype=torch.long), LeanPlan((names,), factors))


def test_an_input_modified_in_place_is_refused():
    class InPlace(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            h = self.a(x)
            out = self.b(h)
            return out + h.mul_(2)  # b's input changes after b ran

    model = InPlace()
    names = tuple(n for n, _ in model.named_parameters())
    with pytest.raises(RunFailure, match="modified in place"):
        LeanEngine(model)(torch.randn(3, 4), torch.zeros(3, dtype=torch.long), LeanPlan((names,), factors))


def test_a_func_kernel_module_drawing_random_numbers_is_refused():
    class Noisy(LayerScale):
        def forward(self, x):
            return nn.functional.dropout(x, 0.5, self.training) * self.gamma

    install(Noisy, FuncKernel())
    model = nn.Sequential(nn.Linear(4, 4), Noisy(4)).train()
    names = tuple(n for n, _ in model.named_parameters())
    with pytest.raises(RunFailure, match="draws random numbers"):
        LeanEngine(model)(torch.randn(3, 4), torch.zeros(3, dtype=torch.long), LeanPlan((names,), factors))

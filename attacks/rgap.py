"""``rgap``: R-GAP (Zhu & Blaschko 2021), the closed-form recursive gradient attack, for one example.

For a plain ``nn.Sequential`` stack ``[Normalize] -> (Conv2d | Linear) -> activation -> ... -> Linear``
whose activations are invertible (leaky ReLU with slope > 0, tanh, sigmoid, identity) and which has no
pooling or normalisation layer:

1. Head (multi-class Linear with bias). With δ = ∂L/∂logits, ``∂W = δ zᵀ`` and ``∂b = δ``: the released
   bias gradient *is* δ, and the head's input is the least-squares ``z_j = Σ_c δ_c ∂W_cj / Σ_c δ_c²``.
   Classes whose bias coordinate was not released get δ_c by alternating least squares on the rank-one
   ``∂W ≈ δ zᵀ``; with no bias coordinate at all, the scale of the rank-one factors is fixed by
   requiring δ ∝ softmax(W z + b) - onehot(y) (a 1-D search; needs the labels).
2. Recurse down. For layer i with known output ``z_i`` (so pre-activation ``a_i = σ⁻¹(z_i)``) and
   δ_{i+1}: ``δ_i = (A_{i+1}ᵀ δ_{i+1}) ⊙ σ'(a_i)``. The layer's input u solves, by least squares,
   * gradient constraints ``vec(∂W_i) = J(δ_i) u`` (J places δ_i at the patch coordinates of a
     convolution, or is ``δ_i ⊗ I`` for a Linear layer);
   * forward constraints ``A_i u = a_i - b_i`` (the convolution written as a matrix).
   Padding: the unknowns are the unpadded input; the zero padding enters the matrices as known zeros,
   i.e. the padding constraints are imposed exactly by elimination rather than as extra rows.
3. The input of the first layer is the *normalised* image; the model's Normalize layer is inverted
   (``x = z·std + mean``) to get pixels.

Mask-aware (default): gradient constraints at unreleased coordinates are dropped (the naive attacker
keeps them with the value 0). ``attack.rgap_tikhonov`` adds λ·|u|² with λ = rgap_tikhonov x the largest
eigenvalue of the layer's normal matrix (a scale-free knob; 0 = plain least squares / pseudo-inverse).

Choices (documented in docs/gradient-inversion.md):

* the system of a layer is solved through its normal equations in float64 with an eigendecomposition
  (one factorisation gives the solution, the numerical rank and the condition number); the rank counts
  singular values above 1e-7 x the largest (the precision the normal equations resolve in float64);
  smaller directions are truncated (pseudo-inverse), as ``lstsq`` with a cut-off would;
* the gradient block is scaled so that both blocks have the same Frobenius norm: with exact gradients
  the solution does not depend on it, with noise neither block drowns the other by its units alone;
* output coordinates a layer could not recover (all their constraints masked) are first taken as 0,
  then re-computed by a forward pass from the recovered input and the layer solved once more.

Per layer the attack reports ``layer<k>_rank``, ``layer<k>_unknowns`` and ``layer<k>_cond`` (k = 1 at the
input; over several targets the smallest rank and the largest condition number), and writes all numbers
(constraints kept, singular values, residuals) of every target and state to ``rgap-scores.json``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dpeval.attacks import gradient_game as gc
from dpeval.attacks.registry import ATTACKS
from dpeval.core.errors import ConfigError
from dpeval.core.models import Normalize
from dpeval.core.params import param
from dpeval.core.runtime import single_cpu_thread
from dpeval.core.scatternet import FixedFeatures

WORKING_MODELS = "cnn3 (the digits default), cnn6, fcn3 and mlp"
RANK_TOL = 1e-7
HEAD_ALS_STEPS = 50
SCALE_GRID = torch.logspace(-4, 4, 801, dtype=torch.float64)


@dataclass
class RGAPParams(gc.ReconstructionParams):
    rgap_tikhonov: float = param(0.0, "Tikhonov λ relative to the largest eigenvalue of each layer's normal "
                                      "matrix", low=0)

    def validate(self) -> None:
        super().validate()
        if self.batch_size != 1:
            raise ConfigError(f"attack.batch_size: rgap inverts a single example (closed form), needs 1, "
                              f"got {self.batch_size}")


# --------------------------------------------------------------------------------------------------
# The model as a chain of blocks


@dataclass
class Block:
    name: str                   # module path of the linear op (its parameters are name.weight/.bias)
    op: nn.Module               # nn.Conv2d or nn.Linear
    act: nn.Module | None       # invertible elementwise activation after op (None = identity)
    in_shape: tuple[int, ...]   # input of op (no batch dim)
    out_shape: tuple[int, ...]  # output of op = output of the activation


@dataclass
class Chain:
    normalize: Normalize | None
    blocks: list[Block] = field(default_factory=list)


def _unsupported(name: str, module: nn.Module, why: str) -> ConfigError:
    return ConfigError(f"model.name: rgap cannot invert layer {name!r} ({type(module).__name__}): {why}; "
                       f"rgap needs a plain Sequential of Conv2d/Linear layers with invertible activations "
                       f"(leaky ReLU, tanh, sigmoid, identity) and no pooling, e.g. {WORKING_MODELS}")


def _leaves(module: nn.Module, prefix: str = ""):
    for name, child in module.named_children():
        path = f"{prefix}.{name}" if prefix else name
        if isinstance(child, nn.Sequential):
            yield from _leaves(child, path)
        elif isinstance(child, FixedFeatures):
            raise _unsupported(path, child, "a fixed feature transform (the scattering of hcnn / hcnn-small) is "
                                            "many-to-one: no closed-form inverse (ig attacks these models)")
        elif any(True for _ in child.children()):
            raise _unsupported(path, child, "a composite module whose execution order is not a plain chain")
        else:
            yield path, child


def parse_chain(model: nn.Module, in_shape: tuple[int, ...]) -> Chain:
    """Split ``model`` into (linear op, activation) blocks, or raise ConfigError naming the layer."""
    if not isinstance(model, nn.Sequential):
        raise _unsupported("<model>", model, "not an nn.Sequential")
    chain = Chain(normalize=None)
    x = torch.zeros(1, *in_shape)
    first = True
    with torch.no_grad():
        for name, m in _leaves(model):
            if isinstance(m, Normalize):
                if not first:
                    raise _unsupported(name, m, "normalisation is only supported as the first layer")
                chain.normalize = m
            elif isinstance(m, (nn.Conv2d, nn.Linear)):
                if isinstance(m, nn.Conv2d) and (m.groups != 1 or m.padding_mode != "zeros"
                                                 or isinstance(m.padding, str)):
                    raise _unsupported(name, m, "only groups=1 convolutions with numeric zero padding")
                if isinstance(m, nn.Linear) and x.dim() != 2:
                    raise _unsupported(name, m, "a Linear layer must follow a Flatten (it would act on the last axis)")
                shape = tuple(x.shape[1:])
                x = _apply_cpu(m, x)
                chain.blocks.append(Block(name, m, None, shape, tuple(x.shape[1:])))
            elif isinstance(m, (nn.LeakyReLU, nn.Tanh, nn.Sigmoid, nn.Identity)):
                if isinstance(m, nn.LeakyReLU) and not m.negative_slope > 0:
                    raise _unsupported(name, m, "a leaky ReLU with slope <= 0 is not invertible")
                if isinstance(m, nn.Identity):
                    continue
                if not chain.blocks or chain.blocks[-1].act is not None:
                    raise _unsupported(name, m, "an activation must directly follow a Conv2d/Linear layer")
                chain.blocks[-1].act = m
            elif isinstance(m, nn.Flatten):
                x = torch.flatten(x, 1)
            elif isinstance(m, (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)):
                raise _unsupported(name, m, "pooling discards information (no closed form)")
            elif isinstance(m, (nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Hardtanh)):
                raise _unsupported(name, m, "the activation is not invertible")
            else:
                raise _unsupported(name, m, "layer type not supported")
            first = False
    if not chain.blocks or not isinstance(chain.blocks[-1].op, nn.Linear) or chain.blocks[-1].act is not None:
        raise ConfigError(f"model.name: rgap needs a last Linear layer producing logits (no activation after it); "
                          f"models that work: {WORKING_MODELS}")
    return chain


def _apply_cpu(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    # Shape walk only: run a CPU float copy of the op's arithmetic on zeros.
    w = m.weight.detach().float().cpu()
    if isinstance(m, nn.Linear):
        return F.linear(x, w)
    return F.conv2d(x, w, None, m.stride, m.padding, m.dilation, m.groups)


def check_model(model: nn.Module, in_shape: tuple[int, ...]) -> None:
    """Raise ConfigError (naming the first unsupported layer) when rgap cannot attack ``model``."""
    parse_chain(model, in_shape)


# --------------------------------------------------------------------------------------------------
# Activations


def _inverse(act: nn.Module | None, z: torch.Tensor) -> torch.Tensor:
    if act is None:
        return z
    if isinstance(act, nn.LeakyReLU):
        return torch.where(z > 0, z, z / act.negative_slope)
    eps = 1e-12
    if isinstance(act, nn.Tanh):
        return torch.atanh(z.clamp(-1 + eps, 1 - eps))
    return torch.logit(z.clamp(eps, 1 - eps))  # Sigmoid


def _derivative(act: nn.Module | None, z: torch.Tensor) -> torch.Tensor:
    """σ'(a) written in terms of the output z = σ(a)."""
    if act is None:
        return torch.ones_like(z)
    if isinstance(act, nn.LeakyReLU):
        return torch.where(z > 0, torch.ones_like(z), torch.full_like(z, act.negative_slope))
    if isinstance(act, nn.Tanh):
        return 1 - z * z
    return z * (1 - z)  # Sigmoid


def _activate(act: nn.Module | None, a: torch.Tensor) -> torch.Tensor:
    return a if act is None else act(a)


# --------------------------------------------------------------------------------------------------
# Linear algebra


def _forward_matrix(op: nn.Module, w: torch.Tensor, in_shape: tuple[int, ...]) -> torch.Tensor:
    """A with op(u) = A u (no bias): rows = output coordinates, columns = input coordinates."""
    if isinstance(op, nn.Linear):
        return w
    n = math.prod(in_shape)
    basis = torch.eye(n, dtype=w.dtype, device=w.device).view(n, *in_shape)
    out = F.conv2d(basis, w, None, op.stride, op.padding, op.dilation)
    return out.reshape(n, -1).T


def _gradient_matrix(op: nn.Conv2d, w: torch.Tensor, delta: torch.Tensor, in_shape: tuple[int, ...]) -> torch.Tensor:
    """J with vec(∂W) = J u for a convolution, given δ = ∂L/∂(conv output) of shape (Cout, Ho, Wo)."""
    n = math.prod(in_shape)
    basis = torch.eye(n, dtype=w.dtype, device=w.device).view(n, *in_shape)
    k = op.kernel_size
    patches = F.unfold(basis, k, dilation=op.dilation, padding=op.padding, stride=op.stride)  # n, Cin·k·k, P
    d = delta.reshape(delta.shape[0], -1)  # Cout, P
    j = torch.einsum("op,nqp->noq", d, patches)  # n, Cout, Cin·k·k  (= weight layout)
    return j.reshape(n, -1).T


def _solve(normal: torch.Tensor, rhs: torch.Tensor, tikhonov: float) -> tuple[torch.Tensor, dict[str, Any]]:
    evals, evecs = torch.linalg.eigh(normal)
    evals = evals.clamp_min(0.0)
    s = evals.sqrt()
    s_max = float(s.max()) if s.numel() else 0.0
    keep = s > RANK_TOL * s_max
    rank = int(keep.sum())
    s_min = float(s.min()) if s.numel() else 0.0
    lam = tikhonov * float(evals.max()) if evals.numel() else 0.0
    inv = torch.where(keep, 1.0 / (evals + lam).clamp_min(1e-300), torch.zeros_like(evals))
    if lam > 0:
        inv = 1.0 / (evals + lam)  # Tikhonov: no truncation needed
    u = evecs @ (inv * (evecs.T @ rhs))
    cond = s_max / s_min if s_min > 0 else math.inf
    return u, {"rank": rank, "unknowns": int(normal.shape[0]), "s_max": s_max, "s_min": s_min,
               "cond": cond, "tikhonov_lambda": lam}


# --------------------------------------------------------------------------------------------------
# The attack proper


def _head(block: Block, grads: dict[str, torch.Tensor], masks: dict[str, torch.Tensor], label: int,
          tikhonov: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
    """(z = input of the head, known mask of z, δ = ∂L/∂logits, report)."""
    w = block.op.weight.detach().to(dtype)
    b = block.op.bias.detach().to(dtype) if block.op.bias is not None else None
    g = grads[f"{block.name}.weight"].to(dtype)
    mg = masks[f"{block.name}.weight"].to(dtype)
    k = g.shape[0]
    if b is not None and f"{block.name}.bias" in grads:
        gb = grads[f"{block.name}.bias"].to(dtype)
        fixed = masks[f"{block.name}.bias"].bool()
    else:
        gb = torch.zeros(k, dtype=dtype, device=g.device)
        fixed = torch.zeros(k, dtype=torch.bool, device=g.device)
    report: dict[str, Any] = {"bias_released": int(fixed.sum())}

    def z_given(delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        num = (mg * delta[:, None] * g).sum(0)
        den = (mg * delta[:, None] ** 2).sum(0)
        lam = tikhonov * float(den.max()) if den.numel() else 0.0
        known = den > 0
        return torch.where(known, num / (den + lam).clamp_min(1e-300), torch.zeros_like(num)), known

    def delta_given(z: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        num = (mg * g * z[None, :]).sum(1)
        den = (mg * z[None, :] ** 2).sum(1)
        est = torch.where(den > 0, num / den.clamp_min(1e-300), torch.zeros_like(num))
        return torch.where(fixed, delta, est)

    if bool(fixed.any()):
        delta = torch.where(fixed, gb, torch.zeros_like(gb))
        z, known = z_given(delta)
        steps = 0 if bool(fixed.all()) else HEAD_ALS_STEPS
        for _ in range(steps):
            delta = delta_given(z, delta)
            z, known = z_given(delta)
    else:
        # Rank-one factors up to scale: ∂W ≈ u vᵀ (masked ALS from the SVD of the zero-filled matrix).
        uu, ss, vv = torch.linalg.svd(g * mg, full_matrices=False)
        u, v = uu[:, 0] * ss[0], vv[0]
        for _ in range(HEAD_ALS_STEPS):
            v = (mg * g * u[:, None]).sum(0) / (mg * u[:, None] ** 2).sum(0).clamp_min(1e-300)
            u = (mg * g * v[None, :]).sum(1) / (mg * v[None, :] ** 2).sum(1).clamp_min(1e-300)
        # z = α v, δ = u / α; choose α so that δ points along softmax(W z + b) - onehot(y).
        onehot = F.one_hot(torch.tensor(label, device=g.device), k).to(dtype)
        scales = torch.cat([SCALE_GRID, -SCALE_GRID]).to(g.device)
        logits = scales[:, None] * (v @ w.T)[None, :] + (b if b is not None else 0.0)
        resid = torch.softmax(logits, dim=1) - onehot[None, :]
        # δ = u/α must be a positive multiple of resid, i.e. sign(α)·u ∝ resid.
        cos = torch.sign(scales) * (resid * u[None, :]).sum(1) / (resid.norm(dim=1) * u.norm() + 1e-300)
        alpha = float(scales[int(cos.argmax())])
        z, delta = alpha * v, u / alpha
        known = (mg.sum(0) > 0)
        report["scale_search_cos"] = float(cos.max())
    return z, known, delta, report


def reconstruct_one(model: nn.Module, shared_grads: dict[str, torch.Tensor], mask: dict[str, torch.Tensor] | None,
                    label: int, in_shape: tuple[int, ...], tikhonov: float = 0.0,
                    dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, list[dict[str, Any]]]:
    """Pixels (1 x C x H x W) recovered from one example's released gradient, and per-layer reports."""
    with single_cpu_thread(next(model.parameters()).device):
        return _reconstruct_one(model, shared_grads, mask, label, in_shape, tikhonov, dtype)


def _reconstruct_one(model: nn.Module, shared_grads: dict[str, torch.Tensor], mask: dict[str, torch.Tensor] | None,
                     label: int, in_shape: tuple[int, ...], tikhonov: float,
                     dtype: torch.dtype) -> tuple[torch.Tensor, list[dict[str, Any]]]:
    chain = parse_chain(model, in_shape)
    grads = {n: g.detach().to(dtype) for n, g in shared_grads.items()}
    masks = {n: (torch.ones_like(g) if mask is None else mask[n].to(dtype)) for n, g in grads.items()}
    blocks = chain.blocks
    z, known, delta, head_report = _head(blocks[-1], grads, masks, label, tikhonov, dtype)
    reports: list[dict[str, Any]] = [{"layer": len(blocks), "name": blocks[-1].name, "kind": "Linear (head)",
                                      "unknowns": int(z.numel()), "recovered": int(known.sum()), **head_report}]
    for i in range(len(blocks) - 2, -1, -1):
        blk, above = blocks[i], blocks[i + 1]
        w = blk.op.weight.detach().to(dtype)
        b = blk.op.bias.detach().to(dtype) if blk.op.bias is not None else None
        w_above = above.op.weight.detach().to(dtype)
        z_out = z.reshape(blk.out_shape)
        known_out = known.reshape(blk.out_shape)
        a_matrix = _forward_matrix(blk.op, w, blk.in_shape)
        bias_full = torch.zeros(a_matrix.shape[0], dtype=dtype, device=w.device)
        if b is not None:
            bias_full = b.repeat_interleave(a_matrix.shape[0] // b.numel())
        g = grads[f"{blk.name}.weight"].reshape(-1)
        mg = masks[f"{blk.name}.weight"].reshape(-1).bool()
        passes = 1 if bool(known_out.all()) else 2
        for attempt in range(passes):
            # δ at this layer's output, from the layer above (A_aboveᵀ δ_above) and σ'.
            up = _transpose(above, w_above, delta, above.in_shape).reshape(blk.out_shape)
            delta_here = up * _derivative(blk.act, z_out)
            pre = _inverse(blk.act, z_out).reshape(-1)
            rows = known_out.reshape(-1)
            a_k = a_matrix[rows]
            fwd_rhs = pre[rows] - bias_full[rows]
            if isinstance(blk.op, nn.Linear):
                # J = δ ⊗ I: JᵀMJ is diagonal, JᵀM vec(∂W) = Σ_o M_oj δ_o ∂W_oj.
                m2 = mg.reshape(w.shape).to(dtype)
                d = delta_here.reshape(-1)
                jtj_diag = (m2 * d[:, None] ** 2).sum(0)
                jtg = (m2 * d[:, None] * g.reshape(w.shape)).sum(0)
                jtj = torch.diag(jtj_diag)
                n_grad = int(mg.sum())
            else:
                jm = _gradient_matrix(blk.op, w, delta_here, blk.in_shape)[mg]
                jtj, jtg = jm.T @ jm, jm.T @ g[mg]
                n_grad = int(jm.shape[0])
            ata = a_k.T @ a_k
            tr_g, tr_f = float(jtj.diagonal().sum()), float(ata.diagonal().sum())
            weight = tr_f / tr_g if tr_g > 0 and tr_f > 0 else 1.0  # squared block weight
            normal = weight * jtj + ata
            rhs = weight * jtg + a_k.T @ fwd_rhs
            u, rep = _solve(normal, rhs, tikhonov)
            if attempt + 1 < passes:  # fill unrecovered outputs by a forward pass from u, then re-solve
                full = _activate(blk.act, (a_matrix @ u + bias_full).reshape(blk.out_shape))
                z_out = torch.where(known_out, z_out, full)
                known_out = torch.ones_like(known_out)
        resid = float((normal @ u - rhs).norm() / rhs.norm().clamp_min(1e-300))
        fwd_resid = float((a_k @ u - fwd_rhs).norm() / fwd_rhs.norm().clamp_min(1e-300)) if rows.any() else math.nan
        reports.append({"layer": i + 1, "name": blk.name, "kind": type(blk.op).__name__,
                        "gradient_constraints": n_grad, "forward_constraints": int(rows.sum()),
                        "normal_residual": resid, "forward_residual": fwd_resid, **rep})
        z, known, delta = u, torch.ones_like(u, dtype=torch.bool), delta_here
    z0 = z.reshape(in_shape)
    if chain.normalize is not None:
        z0 = z0 * chain.normalize.std.to(dtype) + chain.normalize.mean.to(dtype)
    return z0.unsqueeze(0), sorted(reports, key=lambda r: r["layer"])


def _transpose(blk: Block, w: torch.Tensor, delta: torch.Tensor, in_shape: tuple[int, ...]) -> torch.Tensor:
    """A_blkᵀ δ: the gradient of <A u, δ> with respect to u."""
    u = torch.zeros(1, *in_shape, dtype=w.dtype, device=w.device, requires_grad=True)
    with torch.enable_grad():
        if isinstance(blk.op, nn.Linear):
            out = F.linear(u, w)
        else:
            out = F.conv2d(u, w, None, blk.op.stride, blk.op.padding, blk.op.dilation)
        (g,) = torch.autograd.grad(out, u, delta.reshape(out.shape))
    return g[0]


@ATTACKS.register("rgap", "R-GAP closed-form recursive attack (Conv2d/Linear stacks, invertible activations)")
class RGAP(gc.ReconstructionAttack):
    Params = RGAPParams
    headline, higher_leaks, headline_label, baseline = "psnr", True, "R-GAP PSNR (dB)", "baseline_psnr"

    @classmethod
    def check_model(cls, params: Any, model: nn.Module, shape: tuple[int, ...]) -> None:
        check_model(model, shape)

    def guess(self, evidence: gc.Releases) -> gc.Reconstruction:
        return _reconstruct(self.params, evidence)


def _reconstruct(params: RGAPParams, evidence: gc.Releases) -> gc.Reconstruction:
    """One closed-form inversion per target; the rank metrics reported are the worst over the targets
    (smallest rank, largest condition number), every layer report of every target goes to the JSON."""
    pixels, layers = [], []
    for shared, mask, label in zip(evidence.releases, evidence.masks, evidence.labels):
        rec, reports = reconstruct_one(evidence.model, shared.grads, mask, int(label[0]), evidence.view.shape,
                                       params.rgap_tikhonov)
        pixels.append(rec.float())
        layers.append(reports)
    metrics: dict[str, Any] = {}
    solved = [[r for r in reports if "rank" in r] for reports in layers]
    for per_layer in zip(*solved):
        k = per_layer[0]["layer"]
        metrics[f"layer{k}_rank"] = min(r["rank"] for r in per_layer)
        metrics[f"layer{k}_unknowns"] = per_layer[0]["unknowns"]
        metrics[f"layer{k}_cond"] = max(_finite_cond(r["cond"]) for r in per_layer)
    metrics["rank_deficit"] = max(sum(r["unknowns"] - r["rank"] for r in full) for full in solved)
    metrics["max_cond"] = max((_finite_cond(r["cond"]) for full in solved for r in full), default=1.0)
    return gc.Reconstruction(torch.stack(pixels), details={"layers": layers}, metrics=metrics)


def _finite_cond(cond: float) -> float:
    return cond if math.isfinite(cond) else 1e300

"""``gep``: Gradient Embedding Perturbation (Yu, Zhang, Chen, Liu; ICLR 2021), Algorithms 1 and 2.

One logical step:

1. Anchor subspace, from PUBLIC data only (the public split, all that ``bind`` is handed): per-sample gradients
   of ``num_anchors`` public examples at the model's *current* weights (random labels by default, as the
   reference code; the public set's own labels with ``anchor_labels: real``), the flattened parameter
   vector cut into ``groups`` contiguous chunks, ``num_bases`` k split across groups ∝ √(group size), and
   ``power_iter`` rounds of L ← G_aᵀ(G_a L), L ← orthonormalise(L) from a fresh Gaussian start. V_g
   (p_g × k_g) has orthonormal columns. Recomputed every ``anchor_every`` steps (1 = every step, as Algorithm 2).
2. Per private example (flattened g_i): embedding θ_i = g_i·V (concatenated over groups, k-dim), residual
   r_i = g_i − θ_i·Vᵀ from the *unclipped* θ_i; θ_i clipped to C0 and r_i to C1, each with ONE norm over
   all its coordinates (over all groups / all d coordinates, as the reference code); both summed.
3. Release: θ̃ = (Σθ̂_i + N(0, σ²C0²·I_k))/B, r̃ = (Σr̂_i + N(0, σ²C1²·I_d))/B, gradient = V·θ̃ + r̃
   (``biased: true`` = B-GEP: V·θ̃ only, no residual is computed, clipped or released).

Accounting (docs/gep-adaclip.md, "GEP accounting"). Scale the two noisy sums by 1/C0 and 1/C1 and stack
them: one Gaussian mechanism with noise std σ on every coordinate, whose add/remove-one sensitivity is
‖(θ̂_i/C0, r̂_i/C1)‖ ≤ √(1 + 1) = √2. A Gaussian mechanism's (subsampled) privacy depends only on
noise std / sensitivity, so the step is exactly a sampled Gaussian mechanism with multiplier σ/√2: the
accountant is told σ/√2 (``noise_for_accounted``: σ = √2·σ_acc). This is the paper's own "sensitivity √2"
description; the reference code instead doubles the sampled-Gaussian RDP of σ, which treats the two parts
as independently subsampled and is optimistic. B-GEP releases the embedding alone (sensitivity C0), so it
adds noise σ_acc·C0 = (σ/√2)·C0 and is covered by the same accounted multiplier.

Choices where paper and code are silent or disagree are documented next to the code below and in
docs/gep-adaclip.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from dpeval.core.canaries import Canaries, flatten
from dpeval.core.errors import ConfigError
from dpeval.core.params import param
from dpeval.core.per_sample import PerSampleGradients
from dpeval.core.splits import Split
from dpeval.defenses.auditing import CanaryDesign
from dpeval.defenses.base import Capabilities, Defense, DefenseContext, DefenseParams, SharedGradient
from dpeval.defenses.clipping import clip_factors
from dpeval.defenses.lean_plan import LeanBatch, LeanPlan
from dpeval.defenses.registry import DEFENSES

ANCHOR_BUDGET = 1 << 25  # elements (128 MiB float32) of anchor gradients held at once
LABEL_CHOICES = ("random", "resample", "real")  # not "true": YAML would read it as a bool
SQRT2 = math.sqrt(2.0)


@dataclass
class GEPParams(DefenseParams):
    clip0: float = param(0.5, "C0: per-sample L2 clip of the k-dim embedding θ_i", low=0, low_open=True,
                        noise_scale=True)
    clip1: float = param(0.5, "C1: per-sample L2 clip of the d-dim residual r_i", low=0, low_open=True,
                        noise_scale=True)
    num_bases: int = param(200, "k: total anchor-subspace dimension, split over groups ∝ √(group size)", low=1)
    groups: int = param(3, "contiguous chunks of the flattened parameter vector, one basis each", low=1)
    power_iter: int = param(1, "power-iteration rounds (0 = random orthonormal bases, an ablation)", low=0)
    num_anchors: int = param(1000, "m: public examples whose gradients span the subspace (capped at the "
                                   "public set's size)", low=1)
    anchor_every: int = param(1, "recompute the anchors every N steps (1 = every step, as Algorithm 2)", low=1)
    anchor_labels: str = param("random", "`random`: drawn once (as the reference code); `resample`: at each "
                                         "recompute; `real`: the public set's labels", choices=LABEL_CHOICES)
    anchor_batch_size: int = param(256, "micro-batch for the public per-sample gradients (memory only)", low=1)
    biased: bool = param(False, "B-GEP: release V·θ̃ only (no residual)")


def group_bounds(d: int, groups: int) -> list[tuple[int, int]]:
    """Split [0, d) into ``min(groups, d)`` contiguous chunks whose sizes differ by at most one."""
    g = max(1, min(groups, d))
    edges = [round(i * d / g) for i in range(g + 1)]
    return [(edges[i], edges[i + 1]) for i in range(g)]


def allocate_bases(sizes: list[int], k: int, cap: int) -> list[int]:
    """k_g ∝ √p_g (paper §4 / reference code), each capped at min(p_g, cap).

    Largest-remainder rounding makes Σk_g = k exactly when the caps allow (the code's int() floors and
    loses up to one basis per group); bases a capped group cannot take go to the others, again ∝ √p_g.
    ``cap`` is the number of anchors m: power iteration on m anchor gradients spans at most m directions.
    """
    caps = [min(p, cap) for p in sizes]
    alloc = [0] * len(sizes)
    remaining = min(k, sum(caps))
    open_groups = [i for i in range(len(sizes)) if caps[i] > 0]
    while remaining > 0 and open_groups:
        weights = [math.sqrt(sizes[i]) for i in open_groups]
        total = sum(weights)
        shares = [remaining * w / total for w in weights]
        floors = [int(s) for s in shares]
        order = sorted(range(len(open_groups)), key=lambda j: shares[j] - floors[j], reverse=True)
        for j in order[:remaining - sum(floors)]:
            floors[j] += 1
        for j, i in enumerate(open_groups):
            take = min(floors[j], caps[i] - alloc[i])
            alloc[i] += take
            remaining -= take
        open_groups = [i for i in open_groups if alloc[i] < caps[i]]
    return alloc


def check_public(public: Split) -> None:
    """ConfigError when the public split is empty: GEP's anchor subspace is made of public examples."""
    if len(public) == 0:
        raise ConfigError("data.public_fraction: gep needs public data for its anchor subspace, but the "
                          "public split is empty; use data.public_fraction > 0")


def clip_rows(x: torch.Tensor, clip: float) -> torch.Tensor:
    """Scale each row to L2 norm ≤ clip (``clip_factors``: min(1, C/(‖x‖ + 1e-6)))."""
    return x * clip_factors(x.norm(dim=1), clip)[:, None]


@DEFENSES.register("gep", "GEP: public anchor subspace; embedding clipped to C0, residual to C1, noise on each")
class GEP(Defense):
    Params = GEPParams
    # anchors are per-sample gradients of public data at the model's current weights
    capabilities = Capabilities(lean_capable=True, stateful=True, needs_model=True)

    def __init__(self, params: GEPParams, context: DefenseContext) -> None:
        self.names = list(context.param_shapes)
        self.sizes = [math.prod(context.param_shapes[n]) for n in self.names]
        self.d = sum(self.sizes)
        super().__init__(params, context)
        self.bounds = group_bounds(self.d, params.groups)
        # Anchors get their own stream (random labels, power-iteration start), a fresh generator per refresh
        # step: they are a function of (public data, current weights, seed, step) only, never shift the
        # noise stream, and a fresh defense replaying step t recomputes the same bases.
        self.anchor_generator = self.streams.generator("anchors", device=self.device)
        self.bases: list[torch.Tensor] | None = None   # V_g: p_g × k_g, orthonormal columns
        self.bases_step = -1                           # the step the current bases were computed for
        self.step = 0                                  # logical steps released so far
        self.model: torch.nn.Module | None = None
        self.anchor_x: torch.Tensor | None = None
        self.anchor_y: torch.Tensor | None = None
        self.num_classes = 0
        self._psg = None
        self._probe_blocks: dict[str, list] | None = None  # V's rows per parameter, for the lean engine
        self._probe_bases: list[torch.Tensor] | None = None

    # -- accounting ----------------------------------------------------------------------------------
    @classmethod
    def noise_for_accounted(cls, accounted_sigma: float) -> float:
        # Joint release has sensitivity √2 in units of its noise std σ: the accountant sees σ/√2.
        return accounted_sigma * SQRT2

    def accounted_noise_multiplier(self) -> float:
        return self.noise_multiplier / SQRT2

    @property
    def embedding_multiplier(self) -> float:
        """Noise multiplier on the embedding sum: σ (GEP) or σ/√2 = the accounted σ (B-GEP, sensitivity C0)."""
        return self.noise_multiplier / SQRT2 if self.params.biased else self.noise_multiplier

    # -- binding and anchors -----------------------------------------------------------------------------
    @classmethod
    def check_task(cls, params: GEPParams, task: Any) -> None:
        """Raise ConfigError if the task cannot serve GEP (no public split for the anchors)."""
        check_public(task.public)

    def bind(self, model: torch.nn.Module, public: Split, num_classes: int) -> None:
        """Keep the model (its weights move during training) and the public anchor examples: the public split
        is all GEP is handed, the private pool never reaches the anchors."""
        check_public(public)
        m = min(self.params.num_anchors, len(public))
        # The public split is already a uniform random permutation (harness/data.py), so its first m
        # examples are a random subset; they stay fixed for the run, as the reference code's 2000 images.
        self.model = model
        self.num_classes = int(num_classes)
        self.anchor_generator = self.streams.generator("anchors", device=self.device)  # labels: once per run
        self.anchor_x = public.x[:m].to(self.device)
        self.real_y = public.y[:m].to(self.device)
        self.anchor_y = self._draw_labels(m) if self.params.anchor_labels != "real" else self.real_y
        self._psg = PerSampleGradients(model)

    def _draw_labels(self, m: int) -> torch.Tensor:
        return torch.randint(0, self.num_classes, (m,), generator=self.anchor_generator, device=self.device)

    def anchor_rows(self) -> Callable[[], Iterator[torch.Tensor]]:
        """G_a, the m × d per-sample gradients of the public anchors at the model's current weights, as a
        function giving its rows chunk by chunk. G_a is materialised once when m·d ≤ ``ANCHOR_BUDGET``
        elements; beyond that each pass over it recomputes the chunks (micro-batches of at most
        ``anchor_batch_size`` rows of ≤ ``ANCHOR_BUDGET`` elements), so memory stays bounded by the
        budget and the bases V instead of the whole m × d matrix — at the cost of recomputing the
        per-sample gradients once per power iteration."""
        if self._psg is None:
            raise RuntimeError("gep: bind(model, public, num_classes) must be called before the first step")
        if self.params.anchor_labels == "resample":
            self.anchor_y = self._draw_labels(self.anchor_x.shape[0])
        m = self.anchor_x.shape[0]
        step = max(1, min(self.params.anchor_batch_size, ANCHOR_BUDGET // self.d))

        def chunks() -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
            for start in range(0, m, step):
                yield start, self._psg(self.anchor_x[start:start + step], self.anchor_y[start:start + step])

        if m * self.d > ANCHOR_BUDGET:
            return lambda: (self.flatten(grads) for _, grads in chunks())
        # Each chunk's gradients written straight into their rows of G_a: one copy of the m × d matrix, where
        # flattening each chunk and joining the chunks would copy it twice (a sixth of a CPU step, measured).
        materialised = torch.empty(m, self.d, device=self.device)
        for start, grads in chunks():
            self.flatten(grads, out=materialised[start:start + step])
        return lambda: iter([materialised])

    def compute_bases(self, rows: Callable[[], Iterator[torch.Tensor]], m: int) -> list[torch.Tensor]:
        """Power iteration per group on the anchor gradients (Algorithm 1, lines 3–7): from a Gaussian
        start L, ``power_iter`` rounds of L ← orthonormalise(G_aᵀ (G_a L)), each round one pass over the
        rows of G_a (``rows()`` yields its m rows in chunks; the product is a sum over rows)."""
        ks = allocate_bases([hi - lo for lo, hi in self.bounds], self.params.num_bases, m)
        vs = [torch.randn(hi - lo, k, generator=self.anchor_generator, device=self.device)
              for (lo, hi), k in zip(self.bounds, ks)]
        if self.params.power_iter == 0:
            return [torch.linalg.qr(v).Q for v in vs]
        for _ in range(self.params.power_iter):
            ws = [torch.zeros_like(v) for v in vs]  # G_aᵀ (G_a L) = Σ_i g_i (g_iᵀ L): one pass, chunk by chunk
            for chunk in rows():
                for (lo, hi), v, w in zip(self.bounds, vs, ws):
                    block = chunk[:, lo:hi]
                    w += block.T @ (block @ v)
            vs = [torch.linalg.qr(w).Q for w in ws]  # orthonormal columns (QR = Gram–Schmidt up to signs)
        return vs

    def refresh_anchors(self) -> None:
        self.anchor_generator = self.streams.generator("anchors", self.step, device=self.device)
        self.bases = self._probe_blocks = self._probe_bases = None  # free the old V before building the new
        self.bases = self.compute_bases(self.anchor_rows(), self.anchor_x.shape[0])
        self.bases_step = self.step

    def current_bases(self) -> list[torch.Tensor]:
        """The anchor bases of the current step, recomputed when ``anchor_every`` says they are due
        (public: from public data and the current weights)."""
        due = self.step % self.params.anchor_every == 0
        if self.bases is None or (due and self.bases_step != self.step):
            self.refresh_anchors()
        return self.bases

    @property
    def k(self) -> int:
        return 0 if self.bases is None else sum(v.shape[1] for v in self.bases)

    # -- flattening ----------------------------------------------------------------------------------
    def flatten(self, grads: dict[str, torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
        """{name: [b, *shape]} → [b, d] in ``param_shapes`` order (written into ``out`` when given)."""
        parts = [grads[n].reshape(grads[n].shape[0], -1) for n in self.names]
        return torch.cat(parts, dim=1) if out is None else torch.cat(parts, dim=1, out=out)

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return {n: part.reshape(self.param_shapes[n]) for n, part in zip(self.names, flat.split(self.sizes))}

    def embed(self, g: torch.Tensor) -> torch.Tensor:
        """θ = g·V (groups concatenated): [b, d] → [b, k]."""
        return torch.cat([g[:, lo:hi] @ v for (lo, hi), v in zip(self.bounds, self.bases)], dim=1)

    def lift(self, theta: torch.Tensor) -> torch.Tensor:
        """θ·Vᵀ: [b, k] → [b, d]."""
        parts, start = [], 0
        for v in self.bases:
            parts.append(theta[:, start:start + v.shape[1]] @ v.T)
            start += v.shape[1]
        return torch.cat(parts, dim=1)

    # -- the three stages ----------------------------------------------------------------------------
    def reset(self) -> None:
        # Running sums live in the embedding (k) and flattened residual (d) spaces; the base class's
        # per-parameter ``_sum`` is not used.
        self._sum = {}
        self._emb_sum: torch.Tensor | None = None
        self._res_sum: torch.Tensor | None = None
        self.samples_seen = 0

    def clip_and_accumulate(self, grads: dict[str, torch.Tensor]) -> None:
        self.current_bases()
        g = self.flatten(grads)
        theta = self.embed(g)
        if self._emb_sum is None:
            self._emb_sum = torch.zeros(self.k, device=self.device)
        self._emb_sum += clip_rows(theta, self.params.clip0).sum(dim=0)
        if not self.params.biased:
            residual = g - self.lift(theta)  # from the unclipped θ (Algorithm 1, line 11)
            if self._res_sum is None:
                self._res_sum = torch.zeros(self.d, device=self.device)
            self._res_sum += clip_rows(residual, self.params.clip1).sum(dim=0)
        self.samples_seen += g.shape[0]

    # -- the lean engine: θ_i = V^T g_i as probes, ‖r_i‖² = ‖g_i‖² − ‖θ_i‖², Σ c_i r_i = Σ c_i g_i − V Σ c_i θ_i --
    def lean_plan(self) -> LeanPlan:
        bases = self.current_bases()
        if self._probe_blocks is None or self._probe_bases is not bases:
            self._probe_blocks, self._probe_bases = self._blocks(bases), bases
        clip1 = self.params.clip1

        def factors(group: int, squares: torch.Tensor, theta: torch.Tensor | None) -> torch.Tensor:
            residual = (squares - theta.double().pow(2).sum(1)).clamp(min=0).sqrt()
            return clip_factors(residual, clip1)

        return LeanPlan((tuple(self.names),), factors, probes=self._probe_blocks, probe_dim=self.k,
                        sums=not self.params.biased)

    def _blocks(self, bases: list[torch.Tensor]) -> dict[str, list]:
        """Each parameter's rows of V per anchor group: (lo, hi) in the parameter, the group's first
        column, and V's rows for those coordinates."""
        blocks: dict[str, list] = {n: [] for n in self.names}
        starts = [0]
        for size in self.sizes:
            starts.append(starts[-1] + size)
        col = 0
        for (glo, ghi), v in zip(self.bounds, bases):
            for name, s, e in zip(self.names, starts, starts[1:]):
                lo, hi = max(s, glo), min(e, ghi)
                if lo < hi:
                    blocks[name].append((lo - s, hi - s, col, v[lo - glo:hi - glo]))
            col += v.shape[1]
        return blocks

    def accumulate_lean(self, batch: LeanBatch) -> None:
        theta = batch.probes
        if self._emb_sum is None:
            self._emb_sum = torch.zeros(self.k, device=self.device)
        self._emb_sum += clip_rows(theta, self.params.clip0).sum(dim=0)
        if not self.params.biased:
            summed = torch.cat([batch.sums[n].reshape(-1) for n in self.names])
            if self._res_sum is None:
                self._res_sum = torch.zeros(self.d, device=self.device)
            self._res_sum += summed - self.lift((batch.factors[0][:, None] * theta).sum(0, keepdim=True))[0]
        self.samples_seen += batch.count

    # Its own release, not the template's: two noisy sums (k-dim embedding, d-dim residual), not one per parameter.
    def release(self, batch_size: int) -> SharedGradient:
        self.current_bases()  # an empty Poisson batch still releases noise through V
        p = self.params
        emb_sum = self._emb_sum if self._emb_sum is not None else torch.zeros(self.k, device=self.device)
        emb_std = self.embedding_multiplier * p.clip0
        emb = (emb_sum + self.gaussian(emb_sum.shape, emb_std)) / batch_size
        flat = self.lift(emb[None])[0]
        res_std = 0.0
        if not p.biased:
            res_sum = self._res_sum if self._res_sum is not None else torch.zeros(self.d, device=self.device)
            res_std = self.noise_multiplier * p.clip1
            flat = flat + (res_sum + self.gaussian(res_sum.shape, res_std)) / batch_size
        # Per-coordinate noise is σ_r² + σ_e²·‖V_j‖² (V_j = row j of V); ``noise_std`` is its RMS over the
        # d coordinates: sqrt(σ_r² + σ_e²·k/d), because ‖V‖_F² = k.
        rms = math.sqrt(res_std**2 + emb_std**2 * self.k / self.d) / batch_size
        extra = {
            "gep.groups": list(self.bounds),
            "gep.bases_per_group": [v.shape[1] for v in self.bases],
            "gep.bases": list(self.bases),
            "gep.param_order": list(self.names),
            "gep.embedding": emb,
            "gep.noise_std_embedding": emb_std / batch_size,
            "gep.noise_std_residual": res_std / batch_size,
            "gep.num_anchors": int(self.anchor_x.shape[0]) if self.anchor_x is not None else 0,
            "gep.biased": p.biased,
            "gep.bases_step": self.bases_step,
        }
        self.step += 1
        self.reset()
        return SharedGradient(self.unflatten(flat), batch_size=batch_size, noise_std=rms, extra=extra)

    @classmethod
    def audit_design(cls) -> CanaryDesign:
        return GEPDesign()

    # -- public state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Anchors (V per group) and where they apply: public (computed from public data and weights).

        The bases of the *coming* step are computed first when they are due (training would compute them at
        that step's release anyway, from the same weights and anchor stream), so the state recorded at an
        epoch's start is everything a replay of that step needs: a replay from other streams would otherwise
        draw another power-iteration start and release through other anchors."""
        if self._psg is not None:
            self.current_bases()
        return {
            "step": self.step,
            "bases_step": self.bases_step,
            "groups": list(self.bounds),
            "bases": None if self.bases is None else [v.detach().clone() for v in self.bases],
            "param_order": list(self.names),
            "anchor_labels": None if self.anchor_y is None else self.anchor_y.clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore anchors (e.g. an attack replaying a training step): the loaded bases are used for the
        step they were computed for; later steps recompute them on schedule."""
        if list(state.get("groups", self.bounds)) != list(self.bounds):
            raise ValueError(f"gep: groups {state['groups']} do not match this model's {self.bounds}")
        self.step = int(state.get("step", self.step))
        self.bases_step = int(state.get("bases_step", self.step))
        if state.get("bases") is not None:
            self.bases = [v.to(self.device) for v in state["bases"]]
        if state.get("anchor_labels") is not None and self.anchor_x is not None:
            self.anchor_y = state["anchor_labels"].to(self.device)


class GEPDesign(CanaryDesign):
    """GEP: the canary is (v + w)/√2 with v a column of the step's public anchor basis V and w a unit
    vector orthogonal to V, so both the embedding (clipped to C0) and the residual (clipped to C1) carry a
    full-norm contribution — the worst case of the joint release. ``projection``: ⟨V·θ̃, v⟩/std_emb +
    ⟨r̃, w⟩/std_res, with θ̃, V and the stds from the release; ``anchors``: the energy ‖P_V' u‖² of the
    canary in the subspace of the *released* bases V' (constant when V' is public, as it must be)."""

    statistics = ("projection", "anchors")
    fixed_directions = False

    def _bases(self, defense: GEP) -> list[torch.Tensor]:
        return defense.current_bases()  # the defense's own schedule: the bases this step uses (public data)

    def capacity(self, defense: Defense, variant: str) -> int:
        bases = self._bases(defense)
        return sum(min(v.shape[1], (hi - lo) - v.shape[1]) for (lo, hi), v in zip(defense.bounds, bases))

    def design(self, defense: Defense, variant: str, k: int, gen: torch.Generator,
               previous: Canaries | None) -> Canaries:
        bases = self._bases(defense)
        room = [min(v.shape[1], (hi - lo) - v.shape[1]) for (lo, hi), v in zip(defense.bounds, bases)]
        slot_group = torch.repeat_interleave(torch.arange(len(room)), torch.tensor(room))
        slot_col = torch.cat([torch.arange(r) for r in room])
        chosen = torch.randperm(len(slot_group), generator=gen)[:k]
        span = torch.zeros(k, defense.d, device=defense.device)
        resid = torch.zeros(k, defense.d, device=defense.device)
        for g, ((lo, hi), v) in enumerate(zip(defense.bounds, bases)):
            rows = torch.nonzero(slot_group[chosen] == g).flatten()
            if len(rows) == 0:
                continue
            w = torch.randn(hi - lo, len(rows), generator=gen).to(v.device)
            w = torch.linalg.qr(w - v @ (v.T @ w)).Q  # orthonormal columns orthogonal to span(V_g)
            span[rows.to(v.device), lo:hi] = v[:, slot_col[chosen[rows]].to(v.device)].T
            resid[rows.to(v.device), lo:hi] = w.T
        return Canaries(defense.d, dense=(span + resid) / math.sqrt(2.0),
                        parts={"embedding": span, "residual": resid})

    @staticmethod
    def _lifted(shared: SharedGradient) -> tuple[torch.Tensor, torch.Tensor]:
        """(the flat release, its embedding part V·θ̃ lifted back to the parameters)."""
        extra = shared.extra
        flat = flatten(shared.grads, extra["gep.param_order"])
        lifted = torch.zeros_like(flat)
        start = 0
        for (lo, hi), v in zip(extra["gep.groups"], extra["gep.bases"]):
            lifted[lo:hi] = v @ extra["gep.embedding"][start:start + v.shape[1]]
            start += v.shape[1]
        return flat, lifted

    def isotropic(self, defense: Defense, shared: SharedGradient) -> torch.Tensor:
        """The embedding θ̃ over its noise std, then the residual r̃ = release − V·θ̃ over its own (none for
        B-GEP): two independent Gaussian releases stacked, unit noise on every coordinate."""
        extra = shared.extra
        flat, lifted = self._lifted(shared)
        std_emb, std_res = extra["gep.noise_std_embedding"], extra["gep.noise_std_residual"]
        parts = [extra["gep.embedding"] / (std_emb if std_emb > 0 else 1.0)]
        if not extra["gep.biased"]:
            parts.append((flat - lifted) / (std_res if std_res > 0 else 1.0))
        return torch.cat(parts)

    def score(self, defense: Defense, shared: SharedGradient, canaries: Canaries) -> dict[str, torch.Tensor]:
        extra = shared.extra
        flat, lifted = self._lifted(shared)
        anchors = torch.zeros(canaries.dense.shape[0], device=flat.device)
        for (lo, hi), v in zip(extra["gep.groups"], extra["gep.bases"]):
            anchors += canaries.energy_in(lo, hi, v)
        score = canaries.parts["embedding"] @ lifted / extra["gep.noise_std_embedding"]
        if extra["gep.noise_std_residual"] > 0:  # B-GEP releases no residual
            score = score + canaries.parts["residual"] @ (flat - lifted) / extra["gep.noise_std_residual"]
        return {"projection": score, "anchors": anchors}

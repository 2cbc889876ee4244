"""The defense template: one method per stage of a private gradient release, and the declared contract.

Training and attacks call the same three methods, so what an attacker receives is exactly what training
shares:

1. ``begin_epoch(epoch, epochs)``   schedules (e.g. sparsification rate, mask refresh)
2. ``clip_and_accumulate(grads)``   per micro-batch: per-sample transform, clipping, running sum
3. ``release(batch_size)``          noise, divide by B, reset -> ``SharedGradient``

``release`` is a template: (a) Gaussian noise on every coordinate of the running sum, kept only where
the release's mask says released, (b) divide by B, (c) post-process, (d) reset the sum, (e) publish.
A defense fills in what differs through its hooks:

- ``sum_noise_std(B)``  (a) the noise std on the sum (default σ·``params.clip``, C the per-sample bound);
- ``release_mask()``    (a) the public mask (default None: all coordinates released);
- ``transform(avg)``    (c) public post-processing of the noisy average (AdaCliP's b·x + a);
- ``on_release(shared, unreleased_noise)``  (e) public metadata on the release, public state updates.

Noise is drawn one parameter at a time in ``param_shapes`` order, on every coordinate whatever the mask,
so a seed gives the same draws whatever the rate. Defenses whose noise is not one draw per parameter
(GEP's embedding and residual, the noiseless ``none``) override ``release`` itself.

A defense is built from its parameters and one :class:`DefenseContext` (parameter shapes, σ, random streams,
device, steps per epoch); ``dpeval.defenses.clipping.clip_factors`` is the one clip factor
min(1, C / (‖g‖ + 1e-6)) of every defense.

Per-sample gradients arrive as ``{param_name: Tensor[b, *param.shape]}``. A defense never sees more than
one micro-batch at a time, so memory is bounded by the micro-batch, not the logical batch.

Besides the stages a defense declares (defaults in :class:`Defense`):

- ``Params``: its parameter dataclass (fields made with ``dpeval.core.params.param``);
- ``capabilities``: what it declares about itself (:class:`Capabilities`: accounted, lean-capable, auditable,
  stateful, needs_model), read by the runner, the engines and the audits instead of probing its behaviour;
- ``is_dp`` / ``noise_for_accounted`` / ``accounted_noise_multiplier``: the accounting facts;
- ``state_dict`` / ``load_state_dict``: the public state an attacker sees at a given moment (masks,
  anchors, statistics); attacks replay a training step by loading it;
- ``bind``: called once after construction with the model, the public split and the number of classes (never
  the private pool; ``needs_model`` defenses keep what they need);
- ``clipping``: the per-sample transform when it is plain group-wise clipping (the audit spreads its canaries
  over the groups);
- ``lean_plan`` / ``accumulate_lean``: what the lean engine computes for it during backprop, and the sums back;
- ``audit_design``: how ``dpeval audit`` places canaries in its release and scores them;
- ``SharedGradient.rate``: the sparsification / freeze rate of a release, for defenses that have one.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from dpeval.core.params import Params
from dpeval.core.streams import Streams
from dpeval.defenses.auditing import CanaryDesign
from dpeval.defenses.lean_plan import LeanBatch, LeanPlan

if TYPE_CHECKING:
    from dpeval.core.splits import Split
    from dpeval.defenses.clipping import GroupClipping

FLOAT_BYTES = 4  # released values are float32
INDEX_BYTES = 4  # a coordinate index as uint32 (enough for < 4.29e9 parameters)


@dataclass
class SharedGradient:
    """What a defense releases for one logical step, and all an attacker ever receives.

    ``grads`` are the per-parameter released tensors (already divided by the logical batch size).
    Everything else is public metadata: ``mask`` marks released coordinates (True = released; None =
    all released), ``noise_std`` is the std of the Gaussian noise on each released coordinate of
    ``grads`` (σ·C / B for DP-SGD), ``rate`` the fraction of coordinates the defense zeroed by schedule
    (RS, random freeze; None for defenses without a rate), ``extra`` holds defense-specific public state
    (anchors, statistics).
    """

    grads: dict[str, torch.Tensor]
    batch_size: int
    noise_std: float
    mask: dict[str, torch.Tensor] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    rate: float | None = None
    mask_is_new: bool = True  # False while a mask the receiver already has is reused (its indices are not resent)

    @property
    def numel(self) -> int:
        return sum(g.numel() for g in self.grads.values())

    @property
    def released(self) -> int:
        """Number of released (possibly non-zero) coordinates."""
        if self.mask is None:
            return self.numel
        return int(sum(int(m.sum()) for m in self.mask.values()))

    @property
    def density(self) -> float:
        return self.released / max(self.numel, 1)

    def bytes_dense(self) -> int:
        return FLOAT_BYTES * self.numel

    def bytes_sparse(self) -> int:
        """Values of released coordinates plus the cheaper coordinate encoding (uint32 index list or
        bitmask), the latter only when the mask is new to the receiver (an epoch-shared mask is sent once)."""
        if self.mask is None:
            return self.bytes_dense()
        index_cost = min(INDEX_BYTES * self.released, math.ceil(self.numel / 8)) if self.mask_is_new else 0
        return FLOAT_BYTES * self.released + index_cost

    def nonfinite(self) -> str | None:
        """What of the release is NaN or infinite (a parameter's values, or its noise std), None when all is
        finite; one synchronisation for all parameters."""
        names = list(self.grads)
        if names:
            finite = torch.stack([torch.isfinite(g).all() for g in self.grads.values()])
            if not bool(finite.all()):
                return f"the values of {names[int((~finite).nonzero()[0])]}"
        if not math.isfinite(float(self.noise_std)):
            return f"its noise_std ({self.noise_std})"
        return None

    def require_finite(self, defense: str) -> SharedGradient:
        """The release itself; ``NonFiniteRelease`` naming ``defense`` when any of it is NaN or infinite."""
        bad = self.nonfinite()
        if bad is not None:
            raise NonFiniteRelease(f"the defense {defense!r} released NaN or infinite values ({bad}); a release "
                                   f"must be finite, so nothing is attacked or audited on it")
        return self


class NonFiniteRelease(RuntimeError):
    """A defense released NaN or infinite values: a bug of the defense, never a result (no verdict or bound is
    read from such a release)."""


class DefenseParams(Params):
    """Base for a defense's parameter dataclass; ``validate`` (cross-field rules) raises ConfigError naming
    ``defense.<field>``."""


@dataclass
class NoParams(DefenseParams):
    pass


@dataclass(frozen=True)
class DefenseContext:
    """What a defense is built with besides its parameters: ``Defense(params, context)``.

    ``param_shapes``: the trainable parameters' shapes, in ``named_parameters`` order; ``noise_multiplier``: the
    σ the defense must use; ``streams``: where all its randomness comes from (``noise``, ``mask``, ``anchors``…);
    ``device``: where its sums and noise live; ``steps_per_epoch``: the logical steps of one epoch of the model
    it trains (⌊n/B⌋ of its pool), for schedules that act within an epoch (``refresh`` of rs / random-freeze);
    the default 1 makes every step the first of its epoch."""

    param_shapes: Mapping[str, torch.Size]
    noise_multiplier: float
    streams: Streams
    device: torch.device | str = "cpu"
    steps_per_epoch: int = 1


@dataclass(frozen=True)
class Capabilities:
    """What a defense class declares about itself (``Defense.capabilities``), so that the runner, the engines and
    the audits read a declaration instead of probing behaviour:

    - ``accounted``: its release can be a DP mechanism whose ε the accountant reports (``is_dp(params)``
      answers it, and may say no for some parameters, e.g. rs without clipping); False: ε = inf;
    - ``lean_capable``: it implements ``lean_plan`` / ``accumulate_lean``, so the lean engine can train it
      (otherwise only ``clip_and_accumulate`` on materialised per-sample gradients: ``train.engine: func``);
    - ``auditable``: ``dpeval audit`` can place canaries in its release and score them (``audit_design``);
    - ``stateful``: a release depends on state carried across steps (masks per epoch, running statistics,
      anchors), which ``state_dict`` / ``load_state_dict`` expose for replay;
    - ``needs_model``: ``bind`` keeps the model, its public state following the weights (GEP's anchors), so every
      trained model needs its own instance (implies ``stateful``)."""

    accounted: bool = True
    lean_capable: bool = False
    auditable: bool = True
    stateful: bool = False
    needs_model: bool = False

    def __post_init__(self) -> None:
        if self.needs_model and not self.stateful:
            raise ValueError("Capabilities: needs_model implies stateful (its state follows the model's weights)")


class Defense(ABC):
    """Base class. Subclasses set ``Params`` (a dataclass of validated knobs) and ``capabilities`` (what they
    declare, :class:`Capabilities`) and implement the stages. A subclass with more to set up overrides
    ``__init__(self, params, context)`` and calls ``super().__init__(params, context)``.

    ``noise_multiplier`` is the σ the defense must use; ``accounted_noise_multiplier`` is the σ the accountant
    is told (they differ only for defenses whose release composes several Gaussian mechanisms, e.g. GEP).
    """

    name: ClassVar[str] = ""  # set by DEFENSES.register
    Params: ClassVar[type] = NoParams
    capabilities: ClassVar[Capabilities] = Capabilities()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A class that implements ``lean_plan`` declares it (and one that declares it implements it): the lean
        engine is chosen from the declaration, so a silent mismatch would train on another engine than meant."""
        super().__init_subclass__(**kwargs)
        implements = cls.lean_plan is not Defense.lean_plan
        if cls.capabilities.lean_capable and not implements:
            raise TypeError(f"{cls.__name__}: capabilities declare lean_capable but lean_plan is not implemented")
        if "lean_plan" in vars(cls) and implements and not cls.capabilities.lean_capable:
            raise TypeError(f"{cls.__name__}: implements lean_plan; declare it with "
                            f"capabilities = Capabilities(lean_capable=True, ...)")

    def __init__(self, params: Any, context: DefenseContext) -> None:
        self.params = params
        self.steps_per_epoch = context.steps_per_epoch
        self.param_shapes = dict(context.param_shapes)
        self.noise_multiplier = float(context.noise_multiplier)
        self.streams = context.streams
        self.device = torch.device(context.device)
        self.generator = self.streams.generator("noise", device=self.device)
        self._sum: dict[str, torch.Tensor] = {}
        self.samples_seen = 0  # per-sample gradients accumulated since the last release
        self._mask_cache: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None  # ``_mask_weights``
        self.reset()

    # -- accounting facts ------------------------------------------------------------------------------
    @classmethod
    def is_dp(cls, params: Any) -> bool:
        """Whether a release with these parameters is a DP mechanism (ε accounted) or not (ε = inf); by default
        what ``capabilities.accounted`` declares."""
        return cls.capabilities.accounted

    @classmethod
    def check_task(cls, params: Any, task: Any) -> None:
        """Raise ConfigError if this task cannot serve the defense (checked before a run starts)."""
        return None

    @classmethod
    def check_model(cls, params: Any, model: torch.nn.Module) -> None:
        """Raise ConfigError if the defense cannot work on this model (checked before a run starts)."""
        return None

    @classmethod
    def noise_for_accounted(cls, accounted_sigma: float) -> float:
        """The σ the defense must add so that its release is covered by ``accounted_sigma``."""
        return accounted_sigma

    def accounted_noise_multiplier(self) -> float:
        return self.noise_multiplier

    def bind(self, model: torch.nn.Module, public: Split, num_classes: int) -> None:
        """Called once after construction with the model being trained, the task's public split and its number
        of classes: all a defense may shape public state from, the private pool never reaches it. Defenses
        whose public state comes from public data (GEP anchors) keep what they need and declare
        ``needs_model``; the default keeps nothing."""
        return None

    @classmethod
    def audit_design(cls) -> CanaryDesign:
        """How ``dpeval audit`` places canaries in this defense's release and scores them
        (``defenses/auditing.py``; only asked of an ``auditable`` defense); the default suits any Gaussian sum of
        clipped gradients."""
        return CanaryDesign()

    def clipping(self) -> GroupClipping | None:
        """The per-sample transform when it is pure group-wise clipping of the raw per-sample gradient
        (DP-SGD, group-wise clipping); ``None`` otherwise. The audit spreads its canaries over the groups."""
        return None

    # -- the lean engine (harness/engine/lean.py) ------------------------------------------------
    def lean_plan(self) -> LeanPlan | None:
        """The per-sample statistics and factors of the current micro-batch (``defenses/lean_plan.py``), so the
        lean engine can form this defense's sums during backprop without materialising per-sample
        gradients. Implemented by the defenses that declare ``capabilities.lean_capable``; the default (None) is
        never asked for: the others train on materialised gradients (``clip_and_accumulate``) only."""
        return None

    def accumulate_lean(self, batch: LeanBatch) -> None:
        """Add the engine's sums of one micro-batch (the default: they are already the clipped sums)."""
        self.add_to_sum(batch.sums)
        self.samples_seen += batch.count

    # -- the three stages --------------------------------------------------------------------------------
    def begin_epoch(self, epoch: int, epochs: int) -> None:
        """Called before each epoch (and by attacks before producing a release at a given epoch)."""
        return None

    @abstractmethod
    def clip_and_accumulate(self, grads: dict[str, torch.Tensor]) -> None:
        """Add one micro-batch of per-sample gradients to the running sum."""

    def release(self, batch_size: int) -> SharedGradient:
        """Produce the shared gradient of the logical step and reset the running sum: Gaussian noise of
        std ``sum_noise_std`` on every coordinate of the sum (one draw per parameter, in ``param_shapes``
        order; outside ``release_mask`` drawn but not added), divide by B, ``transform``, reset, then
        ``on_release``. A defense overrides these hooks; only one whose noise is not one draw per
        parameter (``gep``, ``none``) overrides this method."""
        std = self.sum_noise_std(batch_size)
        mask = self.release_mask()
        # (Σ + z·std) / B for every parameter at once: a few ``foreach`` operators, not a few per parameter
        noises = [self.standard_normal(t.shape) for t in self._sum.values()]
        torch._foreach_mul_(noises, std)  # rounded as ``gaussian`` rounds
        unreleased: dict[str, torch.Tensor] | None = None
        if mask is None:
            averages = torch._foreach_add(list(self._sum.values()), noises)
        else:  # the noise times the 0/1 mask (exact), and what the mask withheld: noise − kept noise (exact)
            kept = torch._foreach_mul(noises, self._mask_weights(mask))
            averages = torch._foreach_add(list(self._sum.values()), kept)
            withheld = torch._foreach_sub(noises, kept)
            torch._foreach_div_(withheld, batch_size)
            unreleased = dict(zip(self._sum, withheld))
        torch._foreach_div_(averages, batch_size)
        shared = SharedGradient(self.transform(dict(zip(self._sum, averages))), batch_size=batch_size,
                                noise_std=std / batch_size, mask=mask)
        self.reset()
        self.on_release(shared, unreleased)
        return shared

    def _mask_weights(self, mask: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """The release mask as 0/1 float tensors (``foreach`` operators take one dtype), in ``_sum`` order;
        converted once per mask: a defense that hands out the same mask tensors release after release (and
        never changes them in place) is served from the cache, which holds the tensors it was made from."""
        tensors = [mask[n] for n in self._sum]
        cached = self._mask_cache
        if cached is None or len(cached[0]) != len(tensors) or any(a is not b for a, b in zip(cached[0], tensors)):
            cached = self._mask_cache = (tensors, [m.to(t.dtype) for m, t in zip(tensors, self._sum.values())])
        return cached[1]

    # -- hooks of the release ------------------------------------------------------------------------------
    def sum_noise_std(self, batch_size: int) -> float:
        """Std of the noise on each coordinate of the running sum: σ·C, with C = ``params.clip`` (the L2
        bound of one sample's contribution) unless a defense says otherwise."""
        clip = getattr(self.params, "clip", None)
        if clip is None:  # a plug-in without a clip bound must say what its noise is scaled to
            raise NotImplementedError(f"{type(self).__name__}: its Params have no 'clip'; override sum_noise_std")
        return self.noise_multiplier * clip

    def release_mask(self) -> dict[str, torch.Tensor] | None:
        """The public mask of this release ({name: bool tensor}, True = released), or None: all released."""
        return None

    def transform(self, average: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Public post-processing of the noisy average (e.g. AdaCliP's b·x + a); the default: none."""
        return average

    def on_release(self, shared: SharedGradient, unreleased_noise: dict[str, torch.Tensor] | None) -> None:
        """After the reset: add public metadata to ``shared`` and update public state from it.
        ``unreleased_noise`` (with a mask): the noise drawn on the withheld coordinates, divided by B."""
        return None

    # -- helpers for subclasses ---------------------------------------------------------------------------
    def reset(self) -> None:
        """A fresh zero running sum: one buffer (one operator), each parameter's sum a view of it."""
        shapes = list(self.param_shapes.values())
        flat = torch.zeros(sum(math.prod(s) for s in shapes), device=self.device)
        self._sum = {n: v.view(s) for (n, s), v in zip(self.param_shapes.items(),
                                                         flat.split([math.prod(s) for s in shapes]))}
        self.samples_seen = 0

    def add_to_sum(self, sums: dict[str, torch.Tensor]) -> None:
        """``_sum[name] += value`` for every entry of ``sums``, as one operator."""
        torch._foreach_add_([self._sum[n] for n in sums], list(sums.values()))

    def standard_normal(self, shape: torch.Size) -> torch.Tensor:
        """N(0, 1) draws from the defense's own generator (seeded per run; not a cryptographically secure RNG)."""
        return torch.randn(shape, generator=self.generator, device=self.device)

    def gaussian(self, shape: torch.Size, std: float) -> torch.Tensor:
        """N(0, std²) draws from the defense's own generator."""
        return self.standard_normal(shape) * std

    # -- public state --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Public defense state an attacker sees at this moment (masks, anchors, statistics); stateless
        defenses return {}. Everything in it must be computed from public data or earlier releases."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned (an attack replaying a training step); stateless: no-op."""
        return None

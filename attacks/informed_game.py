"""The informed, prior-aware reconstruction game (Balle, Cherubin & Hayes, S&P 2022; Hayes, Mahloujifar & Balle,
NeurIPS 2023); registers nothing. ``informed-recon`` (``attacks/informed_recon.py``) scores in it.

The threat model is the one DP-SGD's guarantee is stated against. The adversary knows every training example but
the target (D₋), the sampling (which steps held the target's slot is *not* known: each step holds it with the
run's rate q), every model state θ_t, every release and all public defense state. The target is drawn uniformly
from n known candidates; the adversary names one. A DP mechanism bounds its success by 1 − f(1/n)
(``dpeval.core.rero``), f the trade-off function of the run's own accounted mechanism (σ, q, T of its ledger).

How the game is played here:

* Residual releases. The adversary subtracts D₋'s contributions from every release (it knows them exactly: each is
  a public function of an example it holds and of public state), which leaves, at step t, the release of a batch
  holding the target (when its slot was sampled) or nothing — plus the mechanism's noise. The game produces
  exactly that residual through the defense's own release path: the release oracle
  (``dpeval.engine.release.ReleaseOracle``) observes, at the run's logical batch size B, a batch holding the secret
  candidate or an empty one, so masks, projections, whitening, group-wise clips and noise are the defense's.
* Steps and states. The game replays all T steps the run's ledger counts, with the run's sampling (Poisson with
  rate q, or one step per epoch for ``train.sampling: shuffle``). The weights of step t are the latest recorded
  state at or before the start of its epoch (``attack.at``: ``init`` always, plus the states asked for); a defense
  is bound to them and put in the state training recorded then. The bound holds for any sequence of weights
  (adaptive composition), so replaying fewer distinct states than steps keeps the comparison valid; more states
  bring the game closer to the run's own trajectory.
* Whitening. Each release is turned into one vector with i.i.d. N(0, 1) noise on every noised coordinate by the
  defense's audit design (``CanaryDesign.isotropic``: over the release's noise std, AdaCliP's shift and scale
  undone, GEP's embedding and residual each over its own std). A candidate's contribution c_i is the whitened
  release of a batch holding it alone minus the whitened empty release, both drawn from one stream, so the noise
  cancels exactly and what remains is its clipped, masked, transformed gradient as the defense releases it.
* Signals. Per target the hook receives, for every step, the inner products ⟨o_t, c_i⟩ of the whitened residual
  with every candidate's contribution, the contributions' squared norms and ‖o_t‖², never the secret; it returns
  one score per candidate (higher: more likely), and the game guesses the argmax.
* Targets and the interval. ``attack.targets`` K independent games. Each draws its own candidates (n held-out
  examples, one per class while n ≤ classes; pools of different games may overlap), its secret, its sampling and
  the noise of every release from its own streams, against the same recorded states. Given the run's states the K
  outcomes are independent Bernoulli trials, each with success probability at most the bound for a correct
  mechanism, so the Clopper–Pearson interval of the success rate is valid for their mean, and the one-sided
  binomial test against the bound (the bound check) is exact: P[Binomial(K, bound) ≥ successes] dominates
  whatever the per-game probabilities.

Reported (``leakage.<attack>.…``): ``success`` with ``success_ci_low`` / ``success_ci_high`` (95 %), the linear
statistic's ``success_linear`` and its interval, ``bound`` (1 − f(1/n)), ``bound_rdp``, ``bound_dp``, ``chance``
(1/n), ``candidates``, ``targets``, ``empirical_mu`` (the GDP μ of ``success_ci_low``: a 95 % lower confidence
bound) beside ``accounted_mu`` (the μ whose GDP bound equals ``bound``), ``norm_ratio`` (mean ‖c_i‖·σ: 1 when the
candidates' contributions reach the clip bound, the case in which an attack can approach the bound),
``p_value`` (against chance), ``bound_p_value`` and ``bound_check`` (``PASS`` / ``FAIL``), the verdict
(``leaks`` when success exceeds chance at level 0.05), and per-target outcomes in ``<attack>-games.json``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy import stats

from dpeval.attacks.base import Artefact, AttackParams, TextFile
from dpeval.attacks.game import Game, Played, Round, Scored
from dpeval.attacks.view import AttackerView
from dpeval.core import rero
from dpeval.core.errors import ConfigError
from dpeval.core.ledger import PrivacyLedger
from dpeval.core.params import param
from dpeval.core.per_sample import PerSampleGradients
from dpeval.core.splits import Split, Task
from dpeval.core.states import AttackState, resolve
from dpeval.core.statistics import clopper_pearson
from dpeval.core.streams import Streams
from dpeval.core.verdicts import BoundCheck, Verdict
from dpeval.defenses.base import Defense, SharedGradient

ALPHA = 0.05  # level of the verdict (success above chance) and of the bound check (success above the bound)


@dataclass
class InformedParams(AttackParams):
    candidates: int = param(10, "n: candidates the target is drawn from, uniformly (held-out examples, one per "
                                "class while n ≤ classes); chance is 1/n", low=2)
    targets: int = param(200, "K independent games (candidates, secret, sampling, noise of their own) played "
                              "against the run's states: the sample of the success rate", low=1, high=100_000)
    at: str | list[str] = param("trajectory", "recorded states the T steps are replayed at (each step at the "
                                              "latest state at or before its epoch; `init` always): "
                                              "`trajectory[:k]`, `epoch:N`, or a list of them")

    @property
    def states(self) -> list[str]:
        return [self.at] if isinstance(self.at, str) else list(self.at)

    def validate(self) -> None:
        for state in self.states:
            AttackState.parse(state)


@dataclass(frozen=True)
class ResidualSignals:
    """What the hook sees of one game: the whitened residual releases against every candidate's contribution."""

    inner: np.ndarray       # [T, n]: ⟨o_t, c_{i,t}⟩
    norms2: np.ndarray      # [T, n]: ‖c_{i,t}‖²
    obs2: np.ndarray        # [T]:    ‖o_t‖²
    sample_rate: float      # q, the rate at which a step holds the target's slot
    noiseless: bool         # the releases carry no noise (a non-DP defense): whitening is the identity


def check_pool(params: InformedParams, test: Split) -> None:
    """Every game needs n distinct held-out candidates spread over the classes."""
    n = params.candidates
    counts = np.bincount(test.y.numpy(), minlength=1) if len(test) else np.zeros(1, dtype=int)
    classes = int((counts > 0).sum())
    per_class = math.ceil(n / max(classes, 1))
    if len(test) < n or (classes and sorted(counts[counts > 0])[-min(n, classes)] < per_class):
        raise ConfigError(f"attack.candidates: {n} candidates per game need {n} held-out examples spread over the "
                          f"classes; the held-out test split has {len(test)} in {classes} class(es)")


def draw_pool(test: Split, n: int, rng: np.random.Generator) -> np.ndarray:
    """n distinct held-out examples: classes in random order (repeated when n > classes), a random unused example
    of each."""
    labels = test.y.numpy()
    classes = rng.permutation(np.unique(labels))
    by_class = {c: list(rng.permutation(np.flatnonzero(labels == c))) for c in classes}
    picks: list[int] = []
    while len(picks) < n:
        for c in classes:
            if len(picks) < n and by_class[c]:
                picks.append(int(by_class[c].pop()))
    return np.asarray(picks)


def draw_sampling(sampling: str, q: float, batch: int, steps: int, epochs: int,
                  rng: np.random.Generator) -> np.ndarray:
    """[T] bool: the steps whose batch holds the target's slot — Poisson with rate q, or (shuffle) one uniformly
    random position of each epoch's permutation of N = B/q examples, none when it falls in the dropped remainder."""
    if sampling != "shuffle":
        return rng.random(steps) < q
    per_epoch = steps // max(epochs, 1)
    held = np.zeros(steps, dtype=bool)
    for e in range(epochs):
        step = int(rng.integers(0, max(round(batch / q), 1))) // batch
        if step < per_epoch:
            held[e * per_epoch + step] = True
    return held


def segments(states: list[AttackState], steps: int, epochs: int) -> list[tuple[str, range]]:
    """(state, steps replayed at it): every step at the latest recorded state at or before its epoch's start."""
    per_epoch = steps // max(epochs, 1)
    starts = {"init": 0, **{str(s): s.epoch for s in states if s.epoch is not None}}
    order = sorted(starts.items(), key=lambda kv: kv[1])
    out = []
    for i, (name, epoch) in enumerate(order):
        end = order[i + 1][1] if i + 1 < len(order) else epochs
        first, last = epoch * per_epoch, (steps if i + 1 == len(order) else end * per_epoch)
        if last > first:
            out.append((name, range(first, last)))
    return out


@dataclass
class InformedDeal:
    """What the informed game draws and keeps: each game's candidates, secret and sampled steps, the replayed
    states, and every game's signals."""

    privacy: PrivacyLedger
    sample_rate: float
    pools: list[np.ndarray]            # per game: its n candidates (rows of the held-out split)
    secrets: np.ndarray                # per game: the position of the target among its candidates
    held: np.ndarray                   # [K, T] bool: the steps holding the target's slot
    plan: list[tuple[str, range]]      # (state, steps replayed at it)
    games: list[TargetGame]


@dataclass(kw_only=True)
class InformedScores(Scored):
    guesses: list[dict[str, int]]      # per game: statistic -> the candidate it names


class InformedReconstructionAttack(Game[ResidualSignals, InformedDeal, InformedScores]):
    """The family: a subclass implements ``guess(signals) -> {statistic: [n] scores}``; the first statistic
    makes the guess, every statistic is reported with its own success rate."""

    Params = InformedParams
    one_thread = True

    @classmethod
    def wanted_states(cls, params: Any) -> set[str]:
        return {s for s in params.states if s not in ("init", "final")}

    @classmethod
    def check_task(cls, params: Any, task: Task) -> None:
        check_pool(params, task.test)

    @classmethod
    def check_privacy(cls, params: Any, privacy: Any) -> None:
        """The bound 1 − f(1/n) discretises the run's privacy loss: a σ so small that the grid would not fit in
        memory (σ = 1e-30) is refused before training, not after it."""
        sigma = privacy.accounted_noise_multiplier
        points = rero.grid_points([*privacy.before, (sigma, privacy.sample_rate, privacy.steps)])
        if points > rero.MAX_GRID:
            raise ConfigError(f"attack.{cls.name}: the run's accounted σ = {sigma:.3g} (q = {privacy.sample_rate:.3g}, "
                              f"{privacy.steps} steps) is too small for its bound 1 − f(1/n): the privacy loss would "
                              f"need {points:.2g} grid points (at most {rero.MAX_GRID:.0e}); use a larger σ or ε")

    def guess(self, evidence: ResidualSignals) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def deal(self, view: AttackerView, task: Task) -> InformedDeal:
        """The K games' candidates, secrets and sampling, and every step of the run replayed for each."""
        p, ledger = self.params, view.privacy
        own = view.streams.scope("attack", self.name)
        epochs, steps, q = int(view.spec.train.epochs), int(ledger.steps), float(ledger.sample_rate)
        rng = own.numpy("candidates")
        pools = [draw_pool(task.test, p.candidates, rng) for _ in range(p.targets)]
        secrets = rng.integers(0, p.candidates, size=p.targets)
        sampler = own.numpy("sampler")
        batch = int(view.spec.train.batch_size)
        held = np.stack([draw_sampling(view.spec.train.sampling, q, batch, steps, epochs, sampler)
                         for _ in range(p.targets)])
        plan = segments(resolve(p.states, epochs), steps, epochs)
        games = [TargetGame(steps, p.candidates) for _ in range(p.targets)]
        for state, span in plan:
            model = view.model_at(state)
            whiten = whitener(view.make_defense(own.scope("design"), bound_to=model))
            psg = PerSampleGradients(model, precision=view.spec.train.precision)

            def release(grads: dict[str, torch.Tensor], streams: Streams, model=model, state=state) -> SharedGradient:
                return view.release.release_gradients(model, grads, state, streams, batch)[0]

            for j, game in enumerate(games):
                x, y = task.test.x[pools[j]], task.test.y[pools[j]]
                grads = {k: v.detach() for k, v in psg(x.to(view.device), y.to(view.device)).items()}
                game.replay(release, whiten, grads, int(secrets[j]), span, held[j], own.scope(state, "target", j))
        return InformedDeal(view.privacy, q, pools, secrets, held, plan, games)

    def rounds(self, dealt: InformedDeal) -> Iterator[Round[ResidualSignals, int]]:
        """One round per game (the candidates already in a random order); the truth: the secret's position."""
        for game, secret in zip(dealt.games, dealt.secrets):
            yield Round(game.signals(dealt.sample_rate), int(secret))

    def score(self, dealt: InformedDeal, played: list[Played[int]]) -> InformedScores:
        p, ledger = self.params, dealt.privacy
        guesses = [{k: int(np.argmax(v)) for k, v in r.answer.items()} for r in played]
        stats_names = list(guesses[0])
        correct = {k: np.array([g[k] == r.truth for g, r in zip(guesses, played)]) for k in stats_names}
        n, k_games = p.candidates, p.targets
        releases = [*ledger.before, (ledger.accounted_noise_multiplier, ledger.sample_rate, ledger.steps)]
        metrics: dict[str, Any] = dict(rero.bounds(releases, ledger.epsilon, ledger.delta, n))
        for i, name in enumerate(stats_names):
            wins = int(correct[name].sum())
            lo, hi = clopper_pearson(wins, k_games)
            suffix = "" if i == 0 else f"_{name}"
            metrics.update({f"success{suffix}": wins / k_games, f"success{suffix}_ci_low": lo,
                            f"success{suffix}_ci_high": hi})
        wins = int(correct[stats_names[0]].sum())
        p_chance = float(stats.binom.sf(wins - 1, k_games, 1.0 / n))
        p_bound = float(stats.binom.sf(wins - 1, k_games, metrics["bound"]))
        sigma = ledger.accounted_noise_multiplier
        metrics.update({
            "statistic": stats_names[0], "candidates": n, "targets": k_games, "chance": 1.0 / n,
            "steps": int(ledger.steps), "states": len(dealt.plan),
            "sampled_steps": float(dealt.held.sum(axis=1).mean()),
            "empirical_mu": rero.gdp_mu_of(metrics["success_ci_low"], n),
            "norm_ratio": float(np.mean([np.mean(g.norm) for g in dealt.games]) * sigma) if sigma > 0 else math.nan,
            "p_value": p_chance, "bound_p_value": p_bound,
            "bound_check": BoundCheck.of(not p_bound <= ALPHA).value,
        })
        return InformedScores(metrics, guesses=guesses)

    def decide(self, scored: InformedScores) -> Verdict:
        """``leaks`` when the success rate exceeds chance at level ``ALPHA`` (the one-sided binomial test)."""
        return Verdict.of(scored.metrics["p_value"] <= ALPHA)

    def artefacts(self, dealt: InformedDeal, scored: InformedScores, verdict: Verdict) -> dict[str, Artefact]:
        """``<attack>-games.json``: every game's candidates, secret, sampled steps and guesses."""
        record = {"rule": {"alpha": ALPHA, "verdict": verdict, "bound_check": scored.metrics["bound_check"]},
                  "states": [[s, span.start, span.stop] for s, span in dealt.plan],
                  "games": [{"candidates": pool.tolist(), "secret": int(secret), "sampled_steps": int(held.sum()),
                             "guesses": guesses}
                            for pool, secret, held, guesses in zip(dealt.pools, dealt.secrets, dealt.held,
                                                                   scored.guesses)]}
        return {"games": TextFile(f"{self.name}-games.json", json.dumps(record, indent=1, default=str))}


Release = Callable[[dict[str, torch.Tensor], Streams], SharedGradient]  # (per-sample grads of the step, streams)
Whiten = Callable[[SharedGradient], torch.Tensor]                         # release -> unit-noise flat vector


class TargetGame:
    """One target's game: its signals, step by step, as the states are replayed."""

    def __init__(self, steps: int, n: int) -> None:
        self.inner = np.zeros((steps, n))
        self.norms2 = np.zeros((steps, n))
        self.obs2 = np.zeros(steps)
        self.noiseless = False
        self.norm: list[float] = []  # mean ‖c_i‖ (whitened) at each replayed state

    def replay(self, release: Release, whiten: Whiten, grads: dict[str, torch.Tensor], secret: int,
               steps: Iterable[int], held: np.ndarray, scope: Streams) -> None:
        """Play ``steps`` of one state: ``grads`` are the n candidates' per-sample gradients there, ``release``
        the defense's release of a step holding given per-sample gradients; step t holds the secret candidate
        when ``held[t]``, nothing otherwise, its noise from ``scope``'s ``release/t``."""
        contrib, noiseless = contributions(release, whiten, grads, scope.scope("candidates"))
        self.noiseless |= noiseless
        norms2 = (contrib * contrib).sum(dim=1).cpu().numpy()
        self.norm.append(float(np.sqrt(norms2).mean()))
        target, nothing = _rows(grads, secret, secret + 1), _rows(grads, 0, 0)
        for t in steps:
            shared = release(target if held[t] else nothing, scope.scope("release", t))
            o = whiten(shared)
            self.inner[t] = (contrib @ o).cpu().numpy()
            self.norms2[t] = norms2
            self.obs2[t] = float(o @ o)
            self.noiseless |= shared.noise_std == 0

    def signals(self, sample_rate: float) -> ResidualSignals:
        return ResidualSignals(self.inner, self.norms2, self.obs2, sample_rate, self.noiseless)


def whitener(defense: Defense) -> Whiten:
    """release -> flat whitened release, by the defense's audit design (``CanaryDesign.isotropic``); ``defense``
    is any instance of the run's defense class and parameters (the attacker knows the mechanism)."""
    design = type(defense).audit_design()

    def whiten(shared: SharedGradient) -> torch.Tensor:
        return design.isotropic(defense, shared).detach().double().flatten()
    return whiten


def _rows(grads: dict[str, torch.Tensor], start: int, stop: int) -> dict[str, torch.Tensor]:
    return {k: v[start:stop] for k, v in grads.items()}


def contributions(release: Release, whiten: Whiten, grads: dict[str, torch.Tensor],
                  streams: Streams) -> tuple[torch.Tensor, bool]:
    """[n, D]: each candidate's whitened contribution to a release — the release of a step holding it alone minus
    the empty step's, both from ``streams`` (the same noise and public state), so only its released (clipped,
    masked, transformed) gradient remains; and whether the release carries no noise."""
    n = next(iter(grads.values())).shape[0]
    empty = release(_rows(grads, 0, 0), streams)
    base = whiten(empty)
    rows = [whiten(release(_rows(grads, i, i + 1), streams)) - base for i in range(n)]
    return torch.stack(rows), empty.noise_std == 0

"""The membership games on the trained models: the shadow-model game (``lira``, ``rmia``: parameters, the game,
the shadow pool of a run, the signals of each target against its references, ``Signals``) and the game on the
victim alone (``loss``, plug-ins: the victim's outputs on the candidates, ``VictimOutputs``); registers nothing.

Games (``attack.mia_target``); in both, every model is trained by the victim's recipe (architecture,
defense and its parameters, σ, optimizer, schedule, epochs, sampling), each shadow i from its own
random streams ``shadow/i``:

- ``victim`` (default): the trained victim is the target. Population: its private pool (n) and held-out
  examples — when the test set holds at least n, a random n of them (population 2n, the LiRA paper's design:
  every example is IN for half the shadows, so online LiRA has as many OUT as IN references); otherwise all
  m of them (digits: n = 1,258, m = 359, each example IN for ~78% of the shadows — ``game_in_fraction``
  reports it and a warning says so). Each of the K shadows trains on exactly n examples of the population, so
  its sample rate q = B/n and its number of steps equal the victim's; the OUT slots are spread evenly, so
  every example is OUT for about K·m'/(n + m') shadows (m' the held-out examples used;
  ``shadow_signals.fixed_size_membership``; at least one, so K ≥ ⌈(n + m')/m'⌉, and at least one IN, so
  K ≥ ⌈(n + m')/n⌉). Members: the n; non-members: the m'.
- ``shadows``: leave one model out. The population (trimmed by one random example when its size is odd)
  is cut into complementary halves of h examples (K even, at least 4); every example is IN for exactly
  K/2 models. Each model in turn is the target; its references are the K − 2 models other than itself
  and its complementary partner (see ``target_signals``), and the K·2h scores are pooled. The models train with
  batch size B' = round(q·h), so their sample rate and number of steps match the victim's (up to the
  rounding of B'); ``target_sample_rate``, ``target_steps`` and ``target_epsilon`` (their accounted ε at
  the victim's σ) are reported.

The shadows of a game are trained once per process and shared by every shadow attack using that game
(keyed by everything that determines them: seed, the data's contents, the architecture and its initial state,
defense, privacy, training, K, game, the training function); the models' signals are read once per game
(``Signals``: what every shadow attack's ``guess`` scores) and cached on disk under ``<run>/signals/`` keyed by a
hash of weights and data indices.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from dpeval.attacks import shadow_signals as sig
from dpeval.attacks.base import Artefact, AttackParams, TextFile
from dpeval.attacks.game import Game, Played, Round
from dpeval.attacks.membership_metrics import (
    MembershipScores,
    mean_metrics,
    membership_metrics,
    membership_verdict,
    roc_artefacts,
)
from dpeval.attacks.view import AttackerView
from dpeval.core.errors import ConfigError
from dpeval.core.ledger import PrivacyLedger
from dpeval.core.params import param
from dpeval.core.per_sample import fixed_front, front_features
from dpeval.core.settings import TrainConfig
from dpeval.core.spec import RunSpec
from dpeval.core.splits import Task
from dpeval.core.streams import Streams
from dpeval.core.verdicts import Verdict
from dpeval.engine.shadow_training import fresh_models, train_shadows

TARGETS = ("victim", "shadows")
log = logging.getLogger("dpeval")


@dataclass
class ShadowParams(AttackParams):
    shadows: int = param(16, "K shadow models (`victim` game: at least ⌈N/m⌉ and ⌈N/n⌉ for a population "
                             "of N = n members + m held-out; `shadows` game: even, at least 4)", low=2)
    mia_target: str = param("victim", "`victim`: the trained victim is the target, shadows train on pools of "
                                      "its size; `shadows`: leave-one-model-out over shadows trained on "
                                      "halves of the population", choices=TARGETS)
    online: bool = param(True, "online: IN and OUT references; offline: OUT references only")

    def validate(self) -> None:
        if self.mia_target == "shadows" and (self.shadows % 2 or self.shadows < 4):
            raise ConfigError(f"attack.shadows: the leave-one-model-out game (attack.mia_target: shadows) needs an "
                              f"even number of at least 4 shadow models (complementary halves), got {self.shadows}")


def victim_game_nonmembers(n: int, m: int) -> int:
    """Held-out examples in the ``victim`` game: n when there are that many (population 2n), else all m."""
    return min(n, m)


def check_game(params: ShadowParams, task: Any) -> None:
    """Refuse a game the task cannot serve (before training where the runner calls ``check_task``)."""
    n, m = len(task.train), len(task.test)
    if params.mia_target == "victim":
        m = victim_game_nonmembers(n, m)
    if m == 0:
        raise ConfigError("data.test_fraction: shadow-model attacks need held-out examples (non-members); "
                          "set data.test_fraction > 0")
    if params.mia_target == "victim":
        need = max(math.ceil((n + m) / m), math.ceil((n + m) / n))
        if params.shadows < need:
            raise ConfigError(f"attack.shadows: the victim game on {n} members + {m} held-out examples needs at "
                              f"least {need} shadow models (every example IN and OUT for one of them), got "
                              f"{params.shadows}")


@dataclass
class ShadowPlan:
    """Who trains on what: the population, the shadows' membership, their training recipe, and (``victim``
    game) which population examples the victim trained on."""

    target: str
    x: torch.Tensor
    y: torch.Tensor
    index: torch.Tensor        # [N] rows of the population (victim pool ∪ test) this game uses
    membership: torch.Tensor   # [K, N] bool
    in_victim: np.ndarray      # [N] bool
    train: TrainConfig         # the shadows' training settings
    features: torch.Tensor | None = None  # x through the architecture's fixed front, once for every model
    data: str = ""             # digest of the population's contents (``data_digest``): names its signals' cache


def plan_game(task: Any, train: TrainConfig, k: int, target: str, gen: torch.Generator) -> ShadowPlan:
    """The game's population, membership matrix (drawn from ``gen``) and the shadows' training settings."""
    pop = sig.population(task)
    n = len(task.train)
    if target == "victim":
        held_out = len(pop.y) - n
        chosen = (torch.randperm(held_out, generator=gen)[:n].sort().values if held_out > n
                  else torch.arange(held_out))  # all of them: the draws below are as before
        index, recipe = torch.cat([torch.arange(n), n + chosen]), train
        if len(chosen) < n:
            log.warning("attack: the victim game has %d members but only %d held-out examples, so its population "
                        "is %d examples, not 2 × %d; each shadow trains on %d of them, so each example is IN for "
                        "%.0f%% of the shadows instead of half, and online LiRA has few OUT references per example",
                        n, len(chosen), len(index), n, n, 100 * n / len(index))
        membership = sig.fixed_size_membership(k, len(index), n, gen)
    else:
        index = torch.randperm(len(pop.y), generator=gen)[: len(pop.y) // 2 * 2].sort().values
        half = len(index) // 2
        membership = sig.membership_matrix(k, len(index), gen)
        recipe = dataclasses.replace(train, batch_size=min(half, max(1, round(train.batch_size / n * half))))
    return ShadowPlan(target, pop.x[index], pop.y[index], index, membership, pop.in_victim[index].numpy(), recipe)


@dataclass
class ShadowPool:
    game: ShadowPlan
    phi: np.ndarray            # [K, N] shadows' φ on the population
    prob: np.ndarray           # [K, N] shadows' probability of the true label


@dataclass(frozen=True)
class Signals:
    """One target against its references on the population, read off the models once per game: the evidence
    every shadow attack scores (``ShadowAttack.guess``). Which examples the target trained on is not part of
    it: the game keeps that (``target_signals``)."""

    target_phi: np.ndarray     # [N]
    target_prob: np.ndarray    # [N]
    ref_phi: np.ndarray        # [R, N]
    ref_prob: np.ndarray       # [R, N]
    ref_in: np.ndarray         # [R, N] bool: reference trained on the example

    def columns(self, order: np.ndarray) -> Signals:
        """The same signals with the population's examples in ``order``."""
        return Signals(self.target_phi[order], self.target_prob[order], self.ref_phi[:, order],
                    self.ref_prob[:, order], self.ref_in[:, order])


_POOLS: dict[str, tuple[Any, ShadowPool]] = {}  # key -> (the training function that trained it, the pool)


def digest_tensors(digest: Any, *tensors: torch.Tensor) -> None:
    for t in tensors:
        digest.update(str((t.dtype, tuple(t.shape))).encode())
        digest.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())


def data_digest(task: Task) -> str:
    """A digest of the contents of the victim's pool and held-out split (not their names)."""
    data = hashlib.sha256()
    digest_tensors(data, task.train.x, task.train.y, task.test.x, task.test.y)
    return data.hexdigest()


def pool_key(view: AttackerView, data: str, k: int, target: str) -> str:
    """Everything that determines a game's shadows (not the attacks' own parameters): the victim's recipe, K, the
    game, the device, the contents of the population (``data``: ``data_digest``),
    the architecture with the initial state it gives shadow 0, and which training function trains them (by the
    function object: ``shadow_pool`` keeps it, so its ``id`` names it while the pool is kept)."""
    (model,) = fresh_models(view.build_model, [view.streams.scope("shadow", 0)])
    architecture = hashlib.sha256(repr(model).encode())
    architecture.update(" ".join(f"{type(m).__module__}.{type(m).__qualname__}" for m in model.modules()).encode())
    for name, tensor in model.state_dict().items():
        architecture.update(name.encode())
        digest_tensors(architecture, tensor)
    trainer = None if view.train_shadow is None else f"id {id(view.train_shadow)}"
    return json.dumps({"spec": view.spec.victim(), "k": k, "target": target, "device": str(view.device),
                       "data": data, "architecture": architecture.hexdigest(), "trainer": trainer},
                      sort_keys=True, default=str)


def shadow_games(spec: RunSpec) -> frozenset[str]:
    """The membership games a run's attacks would play, each named by what determines its shadows: the victim,
    K and the target. Runs that share one can reuse its shadows from the memory of the process that trained
    them (``_POOLS``), so a sweep runs them one after another in one worker (``dpeval.sweep.executors``)."""
    victim = spec.victim()
    return frozenset(json.dumps({"victim": victim, "k": p.shadows, "target": p.mia_target}, sort_keys=True,
                                default=str)
                     for p in spec.attack.values() if isinstance(p, ShadowParams))


# Shadows train in groups of this many, each group saved as it ends, so an interrupted run resumes with the
# groups it finished (each shadow draws only from its own stream scope: grouping leaves the results unchanged).
SHADOW_GROUP = 8


def shadow_pool(view: AttackerView, task: Task, k: int, target: str) -> ShadowPool:
    """Train (or reuse) the K shadows of the game and read their signals on its population."""
    data = data_digest(task)
    key = pool_key(view, data, k, target)
    if key in _POOLS and _POOLS[key][0] is view.train_shadow:
        log.info("membership game: its %d shadow models reused from this process's memory", k)
        return _POOLS[key][1]
    game = plan_game(task, view.spec.train, k, target, view.streams.scope("shadows").generator("membership"))
    game.data = data
    pools = [torch.nonzero(row).flatten() for row in game.membership]
    scopes = [view.streams.scope("shadow", i) for i in range(k)]
    model = fresh_model(view)
    game.features = front_features(fixed_front(model).front, game.x)
    if view.train_shadow is not None:
        states = own_shadows(view, game, pools, scopes)
    else:
        store = view.shadow_progress(key) if view.shadow_progress is not None else None
        states = train_shadows(view.build_model, game.x, game.y, pools,
                               lambda i, model, s: view.make_defense(scopes[i], model, s), game.train, scopes,
                               view.device, progress=view.progress, features=game.features, store=store,
                               group=SHADOW_GROUP if store is not None else 0)
    outputs = [outputs_of(model, view, state, game) for state in states]
    pool = ShadowPool(game, np.stack([o[0] for o in outputs]), np.stack([o[1] for o in outputs]))
    _POOLS.clear()  # keep one game's pool in memory at a time
    _POOLS[key] = (view.train_shadow, pool)
    return pool


def own_shadows(view: AttackerView, game: ShadowPlan, pools: list[torch.Tensor],
                scopes: list[Streams]) -> list[dict[str, torch.Tensor]]:
    """The shadows trained by the researcher's own function (``view.train_shadow``), one after another: model i is
    the architecture initialised in shadow i's ``init`` stream, given its pool and the seed of that stream."""
    assert view.train_shadow is not None
    states = []
    for i, (pool, scope) in enumerate(zip(pools, scopes)):
        (model,) = fresh_models(view.build_model, [scope])
        seed = int(scope.generator("sampler").initial_seed())
        log.info("shadow %d/%d: the given training function on %d examples", i + 1, len(pools), len(pool))
        trained = view.train_shadow(model, game.x[pool], game.y[pool], seed)
        model = trained if trained is not None else model
        states.append({n: t.detach().cpu().clone() for n, t in model.state_dict().items()})
    return states


def fresh_model(view: AttackerView) -> torch.nn.Module:
    """A model of the victim's architecture to load weights into; its construction leaves torch's global
    generator untouched."""
    with torch.random.fork_rng(devices=[]):
        return view.build_model()


def outputs_of(model: torch.nn.Module, view: AttackerView, state: dict[str, torch.Tensor],
               game: ShadowPlan) -> tuple[np.ndarray, np.ndarray]:
    """(φ, probability of the true label) of weights ``state`` on the game's population, through the disk
    cache (a folder per population's contents: the same weights on other data give other signals)."""
    return sig.cached_outputs(model, state, game.features, game.y, game.index,
                              view.out_dir.parent / "signals" / game.data[:16],
                              view.device)


def target_signals(pool: ShadowPool,
                   victim: tuple[np.ndarray, np.ndarray] | None = None) -> list[tuple[Signals, np.ndarray]]:
    """(signals, the target's membership [N]) of the victim against all shadows (``victim`` game; ``victim`` =
    its (φ, prob)), or of each shadow against the K − 2 others that are not its complementary partner
    (``shadows`` game).

    Leaving the partner out keeps every example at exactly K/2 − 1 IN and K/2 − 1 OUT references whatever
    the target's membership. With the partner in, a member of the target would have one IN reference fewer
    than a non-member: the reference counts would reveal the label, and scores that depend on them would
    be biased (online LiRA against members, RMIA's online Pr(x) towards them)."""
    membership = pool.game.membership.numpy()
    if pool.game.target == "victim":
        assert victim is not None
        return [(Signals(victim[0], victim[1], pool.phi, pool.prob, membership), pool.game.in_victim)]
    out = []
    for t in range(pool.phi.shape[0]):
        refs = np.arange(pool.phi.shape[0]) // 2 != t // 2  # neither the target nor its complement
        out.append((Signals(pool.phi[t], pool.prob[t], pool.phi[refs], pool.prob[refs], membership[refs]),
                    membership[t]))
    return out


def target_privacy(privacy: PrivacyLedger, game: ShadowPlan) -> dict[str, float]:
    """Sample rate, steps and accounted ε of the ``shadows`` game's target models: the victim's ledger at
    their q and T."""
    q = game.train.batch_size / (len(game.index) // 2)
    steps = game.train.epochs * ((len(game.index) // 2) // game.train.batch_size)
    return {"target_sample_rate": q, "target_steps": steps, "target_epsilon": privacy.at(q, steps).epsilon}


SCORES_FILE = "scores.csv"
SCORE_COLUMNS = ("target", "split", "index", "label", "member", "score")


def scores_file(task: Task, rows: np.ndarray, scores: np.ndarray, members: np.ndarray,
                targets: np.ndarray) -> dict[str, Artefact]:
    """Which records leak (``scores``, ``scores.csv``): one line per scored (target, example) with the example's split
    (``train``: the victim's private pool, ``test``: held out), its index in its data source (``source_index``: the
    same image in every run on that data), its label, whether the target trained on it and the attack's score
    (higher: more likely a member); ``target`` is -1 for the victim, i for shadow i in the leave-one-model-out game.
    ``rows`` index the game's population: the victim's pool, then the held-out split. Made by the game (it holds
    the task); the attack never sees it."""
    n = len(task.train)
    source = torch.cat([task.train.source_index, task.test.source_index]).numpy()
    label = torch.cat([task.train.y, task.test.y]).numpy()
    lines = [",".join(SCORE_COLUMNS)] + [
        f"{int(t)},{'train' if r < n else 'test'},{int(source[r])},{int(label[r])},{int(m)},{float(s)!r}"
        for t, r, s, m in zip(targets, rows, scores, members)]
    return {"scores": TextFile(SCORES_FILE, "\n".join(lines) + "\n")}


@dataclass
class ShadowDeal:
    """What the shadow game draws and keeps: the pool (who trains on what), the victim's signals (``victim``
    game) and the shuffle of the population."""

    view: AttackerView
    task: Task
    own: Streams
    pool: ShadowPool
    victim: tuple[np.ndarray, np.ndarray] | None
    order: np.ndarray


class ShadowAttack(Game[Signals, ShadowDeal, MembershipScores]):
    """A membership attack scoring a target against shadow references: subclasses give ``guess(Signals) ->
    Scores`` (a pure function of the signals the game read once off the models), and may give ``title()``; the
    game, pool, metrics and ROC artefacts are common."""

    @classmethod
    def check_task(cls, params: ShadowParams, task: Any) -> None:
        check_game(params, task)

    def deal(self, view: AttackerView, task: Task) -> ShadowDeal:
        p = self.params
        pool = shadow_pool(view, task, p.shadows, p.mia_target)
        victim = (outputs_of(fresh_model(view), view, view.states["final"], pool.game)
                  if p.mia_target == "victim" else None)
        own = view.streams.scope("attack", self.name)
        # the population lists the victim's pool first: the hook sees its examples in a shuffled order
        order = torch.randperm(len(pool.game.y), generator=own.generator("order")).numpy()
        return ShadowDeal(view, task, own, pool, victim, order)

    def rounds(self, dealt: ShadowDeal) -> Iterator[Round[Signals, np.ndarray]]:
        """One round per target, the population in one shuffled order; the truth: the target's membership."""
        for target, membership in target_signals(dealt.pool, dealt.victim):
            yield Round(target.columns(dealt.order), membership, dealt.order)

    def score(self, dealt: ShadowDeal, played: list[Played[np.ndarray]]) -> MembershipScores:
        game = dealt.pool.game
        scores = np.concatenate([r.answer.values for r in played])
        labels = np.concatenate([r.truth for r in played])
        metrics = membership_metrics(scores, labels, dealt.view.privacy.delta, dealt.own.numpy("threshold"))
        if self.params.mia_target == "shadows":
            metrics.update(target_privacy(dealt.view.privacy, game))
        metrics["game_in_fraction"] = float(game.membership.float().mean())  # per example, over the shadows
        metrics.update(mean_metrics([r.answer.metrics for r in played]))
        return MembershipScores(metrics, scores=scores, labels=labels)

    def decide(self, scored: MembershipScores) -> Verdict:
        return membership_verdict(scored.metrics)

    def artefacts(self, dealt: ShadowDeal, scored: MembershipScores, verdict: Verdict) -> dict[str, Artefact]:
        rows = dealt.pool.game.index.numpy()
        targets = len(scored.scores) // len(rows)
        target_of = (np.full(len(rows), -1) if self.params.mia_target == "victim"
                     else np.repeat(np.arange(targets), len(rows)))
        return (roc_artefacts(scored.scores, scored.labels, self.title())
                | scores_file(dealt.task, np.tile(rows, targets), scored.scores, scored.labels, target_of))


@dataclass(frozen=True)
class VictimOutputs:
    """The victim's outputs on the candidates, computed once by the game: the evidence of a membership attack
    on the trained victim alone (``VictimMembershipAttack.guess``)."""

    logits: torch.Tensor       # [N, classes], float32 as the final model gives them
    labels: torch.Tensor       # [N] the candidates' labels


OUTPUT_BATCH = 1024  # candidates per forward pass of the victim


@torch.no_grad()
def victim_outputs(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> VictimOutputs:
    """The victim's logits on the candidates ``x`` (labels ``y``), in batches, on ``device``."""
    model.to(device).eval()
    logits = [model(x[i:i + OUTPUT_BATCH].to(device)).cpu() for i in range(0, len(y), OUTPUT_BATCH)]
    return VictimOutputs(torch.cat(logits) if logits else torch.empty(0), y)


@dataclass
class Candidates:
    """What the game on the victim alone keeps: its pool and held-out split as candidates, who is a member, and
    their shuffle."""

    view: AttackerView
    task: Task
    own: Streams
    x: torch.Tensor
    y: torch.Tensor
    labels: np.ndarray       # [N] bool: a member (the victim's pool, listed first)
    order: torch.Tensor


class VictimMembershipAttack(Game[VictimOutputs, Candidates, MembershipScores]):
    """Membership against the trained victim without shadow models (``loss``, plug-ins). The game's
    candidates are the victim's private pool and the held-out split, shuffled (stream ``attack/<name>``
    ``order``) and unlabelled; the game computes the final model's outputs on them once, and a subclass's
    ``guess(VictimOutputs) -> Scores`` gives one score per candidate (higher: more likely a member), which
    the game scores against who was in the pool. ``yeom_rule``: also report
    ``yeom_accuracy``, the balanced accuracy of "member iff the score exceeds the members' mean score"
    (Yeom et al.'s rule, the mean training loss being public to their attacker)."""

    yeom_rule: ClassVar[bool] = False

    @classmethod
    def check_task(cls, params: Any, task: Task) -> None:
        if len(task.test) == 0:
            raise ConfigError(f"data.test_fraction: the {cls.name} attack needs held-out examples (non-members); "
                              "set data.test_fraction > 0")

    def deal(self, view: AttackerView, task: Task) -> Candidates:
        x, y = torch.cat([task.train.x, task.test.x]), torch.cat([task.train.y, task.test.y])
        labels = np.r_[np.ones(len(task.train), bool), np.zeros(len(task.test), bool)]
        own = view.streams.scope("attack", self.name)
        order = torch.randperm(len(y), generator=own.generator("order"))
        return Candidates(view, task, own, x, y, labels, order)

    def rounds(self, dealt: Candidates) -> Iterator[Round[VictimOutputs, np.ndarray]]:
        """One round: the final model's outputs on the shuffled candidates."""
        order, view = dealt.order, dealt.view
        yield Round(victim_outputs(view.model_at("final"), dealt.x[order], dealt.y[order], view.device),
                    dealt.labels, order.numpy())

    def score(self, dealt: Candidates, played: list[Played[np.ndarray]]) -> MembershipScores:
        (only,) = played
        scores, labels = only.answer.values, only.truth
        metrics = membership_metrics(scores, labels, dealt.view.privacy.delta, dealt.own.numpy("threshold"))
        if self.yeom_rule:
            threshold = scores[labels].mean()
            metrics["yeom_accuracy"] = float(((scores[labels] > threshold).mean()
                                              + (scores[~labels] <= threshold).mean()) / 2)
        metrics.update(only.answer.metrics)
        return MembershipScores(metrics, scores=scores, labels=labels)

    def decide(self, scored: MembershipScores) -> Verdict:
        return membership_verdict(scored.metrics)

    def artefacts(self, dealt: Candidates, scored: MembershipScores, verdict: Verdict) -> dict[str, Artefact]:
        n = len(dealt.y)
        return (roc_artefacts(scored.scores, scored.labels, self.title())
                | scores_file(dealt.task, np.arange(n), scored.scores, scored.labels, np.full(n, -1)))

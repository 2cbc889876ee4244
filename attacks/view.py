"""The attacker's view of a run: everything an attack may see, and nothing that reaches the private pool.

An ``AttackerView`` holds the victim's architecture and recorded model states (``init``, ``epoch:N``,
``final``; ``dpeval.core.states.AttackState`` names them), the defense's public state at the same moments,
the release oracle (``dpeval.engine.release.ReleaseOracle``: the defense's own stages applied to a batch),
the public split, the data's public facts (shape, classes, normalisation), the run's privacy ledger, the
public hyperparameters, factories for fresh models and defenses (shadow models), random streams, an output
folder and the device.

What it does not hold: the private pool, the held-out split, or which examples are members. Those stay with
the game (``Attack.play(view, task)``: the template of ``attacks/game.py``, filled in by the attack families of
``attacks/gradient_game.py``, ``attacks/membership_game.py`` and ``attacks/informed_game.py``), which chooses the
targets, hands an attack only releases and unlabelled candidates, and scores its guesses against the truth it
keeps.
``tests/test_layers.py`` checks that no module registering an attack reaches the pool.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpeval.core.errors import ConfigError
from dpeval.core.ledger import PrivacyLedger
from dpeval.core.spec import RunSpec
from dpeval.core.splits import Split
from dpeval.core.streams import Streams
from dpeval.defenses.base import Defense
from dpeval.engine.release import ReleaseOracle
from dpeval.engine.shadow_training import ShadowProgress


@dataclass(frozen=True)
class AttackerView:
    architecture: nn.Module                            # the victim's architecture (load a state: ``model_at``)
    states: Mapping[str, dict[str, torch.Tensor]]      # recorded weights by state name
    defense_states: Mapping[str, dict[str, Any]]       # the defense's public state (``state_dict()``) then
    release: ReleaseOracle                             # release(model, x, y, at, streams) -> (release, report)
    public: Split                                      # the public split (no private example)
    shape: tuple[int, int, int]                        # C, H, W
    num_classes: int
    mean: tuple[float, ...]                            # the normalisation (from the public split)
    std: tuple[float, ...]
    privacy: PrivacyLedger                             # what training released: σ, q, steps, ε, δ
    spec: RunSpec                                      # the public hyperparameters
    build_model: Callable[[], nn.Module]               # a fresh model of the victim's architecture
    make_defense: Callable[..., Defense]               # make_defense(streams, bound_to, steps_per_epoch): fresh
    streams: Streams                                   # the run's streams (attacks draw from attack/…, shadow…)
    out_dir: Path
    device: torch.device
    shadow_progress: Callable[[str], ShadowProgress] | None = None  # game key -> where its finished shadows keep
    # the researcher's own training function for shadow models (train_shadow(model, x, y, seed) trains the fresh
    # model in place or returns the trained one); None: dpeval's trainer with the victim's recipe
    train_shadow: Callable[[nn.Module, torch.Tensor, torch.Tensor, int], nn.Module | None] | None = None
    progress: bool | None = None  # False: no progress bar (shadow models' training); None: the engine's default

    def model_at(self, state: str) -> nn.Module:
        """A private copy of the architecture with the weights of ``state``, on the device, eval mode."""
        if state not in self.states:
            raise ConfigError(f"attack.at: no model state {state!r} was recorded "
                              f"(have: {', '.join(sorted(self.states))})")
        model = copy.deepcopy(self.architecture)
        model.load_state_dict(self.states[state])
        model.to(self.device).eval()
        for p in model.parameters():
            p.requires_grad_(True)
        return model

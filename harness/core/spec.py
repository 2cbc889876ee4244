"""The validated description of one run (``RunSpec``) and its run key: what every layer reads about a run.

``dpeval.config.build_spec`` builds it from raw settings (validated against the declared settings and the chosen
defense's and attacks' own ``Params``); the canonical form is the fully-defaulted nested dict, and the run key is a
hash of it (``device`` and ``defaults`` excluded: where a run executes does not change what it is, nor whether its
settings were given or came from the data set's defaults; settings added after results
were stored are left out while at their defaults: ``dpeval.core.params.param(added=)``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from dpeval.core.files import file_digest
from dpeval.core.params import Params, param, unkeyed
from dpeval.core.settings import DataConfig, ModelConfig, PrivacyConfig, TrainConfig

DEVICES = ("auto", "cpu", "cuda")


@dataclass
class RunSpec:
    """Everything that defines one run. ``defense`` holds the defense's validated Params; ``attack`` maps
    each selected attack's name to its validated Params."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    defense_name: str = "dpsgd"
    defense: Params | Any = None                       # the defense's Params
    attacks: list[str] = field(default_factory=list)
    attack: dict[str, Params] = field(default_factory=dict)  # attack name -> its Params
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    seed: int = param(0, "run seed: every random stream of the run derives from it (docs/architecture.md)",
                      low=0)
    device: str = param("auto", "`auto` uses CUDA when present; not part of the run key", choices=DEVICES)
    defaults: list[str] = param(factory=list, help="recorded by dpeval: the defaults this run took for keys it "
                                                   "did not set, as `key=value`: its data set's recipe (\"Data-set "
                                                   "defaults\" below), `attack.<name>.at=final` with `model.weights`; "
                                                   "not part of the run key; never an input (a file, `--set` or "
                                                   "`configure` that gives it is refused)")

    def canonical(self) -> dict[str, Any]:
        """The fully-defaulted nested form: what is hashed, stored and shown."""
        return {
            "data": dataclasses.asdict(self.data),
            "model": dataclasses.asdict(self.model),
            "defense": {"name": self.defense_name, **dataclasses.asdict(self.defense)},
            "attacks": list(self.attacks),
            "attack": {name: dataclasses.asdict(params) for name, params in sorted(self.attack.items())},
            "privacy": dataclasses.asdict(self.privacy),
            "train": dataclasses.asdict(self.train),
            "seed": self.seed,
            "device": self.device,
            "defaults": list(self.defaults),
        }

    def victim(self) -> dict[str, Any]:
        """The canonical form without the attacks: everything that determines the victim a run trains, and so
        the shadow models of any membership game played on it."""
        return {k: v for k, v in self.canonical().items() if k not in ("attacks", "attack")}

    @property
    def run_key(self) -> str:
        content = {k: v for k, v in self.canonical().items() if k not in ("device", "defaults")}
        owners = [(content[s], getattr(self, s)) for s in ("data", "model", "defense", "privacy", "train")]
        owners += [(content["attack"][name], params) for name, params in self.attack.items()]
        for section, params in owners:  # see param(added=, keyed=)
            for *parents, leaf in unkeyed(params):
                where = section
                for step in parents:
                    where = where[step]
                del where[leaf]
        if self.model.weights is not None:  # the file's content, not only its name: new weights are a new run
            content["model"]["weights_sha256"] = file_digest(self.model.weights)
        blob = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

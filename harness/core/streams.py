"""One table of random streams: every random draw of a run derives from the run seed through a named stream.

A stream is addressed by a path: an owner scope (``victim``, ``shadow/3``, ``attack/ig``, ``audit``) plus a
stream name from :data:`STREAMS` and an optional index (a step, a restart, a release). Its seed is a hash
of (run seed, path), so

- streams are independent of each other (changing the noise changes no batch, shadow 3's batches share
  nothing with the victim's or shadow 4's), and adding a stream never shifts another;
- the same run seed reproduces every stream bit for bit (on CPU, at a fixed thread count);
- nothing is derived by arithmetic on seeds (``seed * 1000 + k`` collides across owners).

Owners hand their :class:`Streams` down: the runner gives the victim ``Streams(seed).scope("victim")``,
shadow model i ``Streams(seed).scope("shadow", i)``, attack A ``Streams(seed).scope("attack", A)``; a
defense draws its noise, masks and anchors from the streams it was given.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

# The named streams, and what each one drives. An owner may draw any of them; the scope keeps owners apart.
STREAMS: dict[str, str] = {
    "init": "model initialisation (torch's global generator, forked for the build)",
    "sampler": "batch sampling (Poisson draws or the per-epoch shuffle)",
    "noise": "the defense's Gaussian noise",
    "pca": "the Gaussian noise of a DP-PCA of the inputs (model.pca), released before training",
    "mask": "RS / random-freeze coordinate masks",
    "anchors": "GEP anchor labels and power-iteration starts (indexed by the refresh step)",
    "membership": "which shadow model trains on which half of the population",
    "targets": "which private examples a gradient attack targets",
    "restarts": "an optimisation attack's random starts",
    "baseline": "data-free baseline guesses of a reconstruction attack",
    "candidates": "grad-mia's member batches and non-member candidates; informed-recon's candidate pools and secrets",
    "release": "the noise of one observed release (indexed by the release)",
    "canaries": "audit canary directions and in/out assignment",
    "threshold": "the random half on which a membership threshold is chosen",
    "order": "a membership game's shuffle of the unlabelled candidates it hands an attack",
    "dropout": "the dropout masks of a victim's release observed by a gradient attack (torch's global generator, "
               "forked for the release; training's own masks come from the global stream)",
    "global": "Python's, NumPy's and torch's global generators (anything not given a stream)",
}

SEED_BITS = 63  # torch.Generator.manual_seed takes a signed 64-bit value


def stream_seed(seed: int, path: str) -> int:
    """The seed of stream ``path`` under run seed ``seed``: SHA-256 of both, truncated to 63 bits."""
    digest = hashlib.sha256(f"dpeval/{int(seed)}/{path}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> (64 - SEED_BITS)


@dataclass(frozen=True)
class Streams:
    """The random streams of one owner under a run seed (see the module docstring)."""

    seed: int
    owner: str = ""

    def scope(self, *parts: object) -> Streams:
        """The streams of a sub-owner, e.g. ``Streams(0).scope("shadow", 3)``."""
        path = "/".join(str(p) for p in parts)
        return Streams(self.seed, f"{self.owner}/{path}" if self.owner else path)

    def path(self, name: str, index: int | None = None) -> str:
        if name not in STREAMS:
            raise KeyError(f"unknown random stream {name!r}; the table has {', '.join(STREAMS)}")
        path = f"{self.owner}:{name}"
        return path if index is None else f"{path}#{index}"

    def seed_of(self, name: str, index: int | None = None) -> int:
        return stream_seed(self.seed, self.path(name, index))

    def generator(self, name: str, index: int | None = None, device: torch.device | str = "cpu") -> torch.Generator:
        """A fresh torch generator on ``device`` for stream ``name`` (and ``index``)."""
        gen = torch.Generator(device=device)
        gen.manual_seed(self.seed_of(name, index))
        return gen

    def numpy(self, name: str, index: int | None = None) -> np.random.Generator:
        return np.random.default_rng(self.seed_of(name, index))

    @contextlib.contextmanager
    def torch_global(self, name: str = "init", index: int | None = None) -> Iterator[None]:
        """Run a block (e.g. building a model, whose layers draw from torch's global generator) with the
        global CPU generator seeded from a stream; the outer global state is restored afterwards."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed_of(name, index))
            yield


def seed_globals(streams: Streams) -> None:
    """Seed Python's, NumPy's and torch's global generators from the ``global`` stream, for any library
    code that draws from them without being handed a stream."""
    seed = streams.seed_of("global")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)

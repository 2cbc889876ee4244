"""Token-sequence datasets: learnable synthetic sequences and a local text file read as bytes.

* ``tokens``: sequences of ``data.tokens.length`` token ids; class k has one prototype sequence drawn
  uniformly from the vocabulary, each example is its class's prototype with every token redrawn uniformly
  with probability ``data.tokens.noise`` (labels ``i % classes``), all from a generator seeded with
  ``split_seed``. A token dataset stores x as float token ids of shape (1, 1, T) with identity
  normalisation (mean 0, std 1) and ``Task.vocab`` set; token models (``gpt``) round them back to ids.
* ``textfile``: ``data.root`` names a local file read as bytes (vocabulary 256); it is cut into
  non-overlapping windows of ``data.tokens.length + 1`` bytes, x the first ``length`` bytes and the class
  the last one (next-byte prediction as 256-way classification); the remainder is dropped. Only a regular file
  (a link to one is fine) of at most ``MAX_TEXTFILE_BYTES`` (256 MiB) is read: a FIFO would block, a device
  (``/dev/zero``) never end, and the windows take about 10 bytes of memory per byte of text.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from dpeval.core.datasets._common import abs_root, one_line
from dpeval.core.errors import ConfigError
from dpeval.core.files import open_regular
from dpeval.core.registry import DATASETS
from dpeval.core.settings import DataConfig
from dpeval.core.splits import Task, assemble

MAX_TEXTFILE_BYTES = 2**28  # the largest text file read (bytes): 256 MiB of bytes become about 2.5 GB of windows


def token_task(task: Task, vocab: int) -> Task:
    """A task of token ids: identity normalisation (the ids reach the model unchanged) and its vocabulary."""
    return dataclasses.replace(task, mean=(0.0,), std=(1.0,), vocab=vocab)


@DATASETS.register(
    "tokens", "learnable synthetic token sequences: one random prototype sequence per class, tokens redrawn at random",
    default_model="gpt",
)
def _load_tokens(cfg: DataConfig) -> Task:
    tok = cfg.tokens
    gen = torch.Generator().manual_seed(cfg.split_seed)
    prototypes = torch.randint(0, tok.vocab, (tok.classes, tok.length), generator=gen)
    y = torch.arange(tok.size) % tok.classes
    redraw = torch.rand(tok.size, tok.length, generator=gen) < tok.noise
    noise = torch.randint(0, tok.vocab, (tok.size, tok.length), generator=gen)
    x = torch.where(redraw, noise, prototypes[y])
    return token_task(assemble(cfg, tok.classes, x.float().view(tok.size, 1, 1, tok.length), y), tok.vocab)


@DATASETS.register(
    "textfile", "a local text file (data.root) as byte tokens: windows of data.tokens.length bytes, the class "
                "is the next byte",
    default_model="gpt",
)
def _load_textfile(cfg: DataConfig) -> Task:
    path, t = abs_root(cfg), cfg.tokens.length
    try:
        with open_regular(path) as f:
            # The read itself is bounded too: a size the file reports is not trusted (procfs files say 0).
            size = os.fstat(f.fileno()).st_size
            data = bytearray(f.read(MAX_TEXTFILE_BYTES + 1) if size <= MAX_TEXTFILE_BYTES else b"")
    except OSError as err:
        raise ConfigError(f"data.root: textfile needs a readable regular file, got {path} "
                          f"({err.strerror or one_line(str(err))})") from None
    if max(size, len(data)) > MAX_TEXTFILE_BYTES:
        raise ConfigError(f"data.root: {path} holds more than {MAX_TEXTFILE_BYTES} bytes, textfile's limit; give it "
                          f"a part of the text")
    n = len(data) // (t + 1)
    if n < 2:
        raise ConfigError(f"data.root: {path} has {len(data)} bytes; textfile needs at least 2 windows of "
                          f"data.tokens.length + 1 = {t + 1} bytes")
    windows = torch.frombuffer(data, dtype=torch.uint8, count=n * (t + 1)).view(n, t + 1)
    x, y = windows[:, :t].float().view(n, 1, 1, t), windows[:, t].long()
    return token_task(assemble(cfg, 256, x, y), 256)

"""Helpers shared by the dataset loaders (no datasets are registered here)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from dpeval.core.settings import DataConfig


def one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def abs_root(cfg: DataConfig) -> Path:
    return Path(os.path.expanduser(str(cfg.root))).resolve()

"""The training images of a run's private pool, by source index, loaded from its stored configuration: what
``dpeval report`` hands the report's exposure grids (the report itself reads stored artefacts only)."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np

from dpeval.core.errors import ConfigError, brief
from dpeval.results import RunResult

Images = tuple[dict[int, np.ndarray] | None, str]


def loader() -> Callable[[RunResult], Images]:
    """A function from a stored run (``ResultStore.results``) to (source index → image, H × W or H × W × C in
    [0, 1]; "") or (None, why the data cannot be loaded here), loading each data configuration once."""
    cache: dict[str, Images] = {}

    def training_images(run: RunResult) -> Images:
        from dpeval.config import build_spec
        from dpeval.core.datasets import load_task

        key = json.dumps(run.config.get("data"), sort_keys=True, default=str)
        if key not in cache:
            try:
                task = load_task(build_spec(run.config).data)
                x = task.train.x.numpy()
                x = x[:, 0] if x.shape[1] == 1 else x.transpose(0, 2, 3, 1)
                cache[key] = ({int(i): img for i, img in zip(task.train.source_index.tolist(), x)}, "")
            except (ConfigError, OSError, ValueError) as exc:
                cache[key] = (None, brief(str(exc), 200))
        return cache[key]

    return training_images

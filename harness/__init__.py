"""dpeval harness: config, data, models, per-sample gradients, training, accounting, results."""

__version__ = "0.1.0"

"""The core layer: errors, registry, parameter schema, settings, random streams, accounting, statistics,
data, models and per-sample gradients. Imports nothing from the rest of the project."""

"""The engine layer: the training loop, the lean per-sample engine (``lean``: its kernel table takes outside layers
through ``register_kernel``), applying and observing releases, and shadow-model training. Imports dpeval.core and
defenses."""

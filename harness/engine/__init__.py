"""The engine layer: the training loop, the book-keeping per-sample engine, applying and observing releases,
and shadow-model training. Imports dpeval.core and defenses."""

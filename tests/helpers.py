"""Helpers shared by several test files."""

from harness.config import RunSpec, build_spec, set_dotted


def spec_for(defense: str, **sets) -> RunSpec:
    """A RunSpec for ``defense`` with dotted overrides written with ``__`` (``train__epochs=2``)."""
    raw = {"defense": {"name": defense}}
    for key, value in sets.items():
        set_dotted(raw, key.replace("__", "."), value)
    return build_spec(raw)

"""Input-shape arithmetic shared by the model factories (no models are registered here): a shape that cannot
work is reported as a ``ConfigError`` naming the smallest size the model needs, not as a torch error mid-training.
"""

from __future__ import annotations

from typing import Callable, Sequence

from torch import nn

from dpeval.core.errors import ConfigError

Shape = tuple[int, int, int]
ModelFactory = Callable[[Shape, int], nn.Module]


def takes_settings(*names: str) -> Callable[[Callable], Callable]:
    """Mark a factory as reading the shape settings ``names`` of ``model``:
    ``factory(in_shape, num_classes, settings=, vocab=)``; ``build_model`` refuses any other setting given."""
    def mark(factory: Callable) -> Callable:
        factory.settings = names  # type: ignore[attr-defined]
        return factory
    return mark


def check_in_shape(name: str, in_shape: Sequence[int], num_classes: int) -> Shape:
    if (
        len(tuple(in_shape)) != 3
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in in_shape)
    ):
        raise ConfigError(
            f"model.name: {name!r} needs an input shape (channels, height, width) of positive "
            f"integers, got {tuple(in_shape)}"
        )
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ConfigError(f"model.name: {name!r} needs num_classes >= 1, got {num_classes!r}")
    c, h, w = in_shape
    return (c, h, w)


def _pair(v: int | tuple[int, ...], i: int) -> int:
    return v if isinstance(v, int) else v[i]


def walk(layers: nn.Sequential, shape: Shape) -> Shape | None:
    """Output shape of a plain conv/pool stack, or None if some feature map would be empty.

    Uses the floor formula from the Conv2d/MaxPool2d docs; ceil_mode and string padding are not used
    by any model here.
    """
    c, h, w = shape
    for m in layers:
        if isinstance(m, (nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d)):
            k, s, p = m.kernel_size, m.stride, m.padding
            d = getattr(m, "dilation", 1)
            if isinstance(p, str) or getattr(m, "ceil_mode", False):
                raise NotImplementedError("shape walk supports numeric padding and floor mode only")
            h, w = (
                (size + 2 * _pair(p, i) - _pair(d, i) * (_pair(k, i) - 1) - 1) // _pair(s, i) + 1
                for i, size in enumerate((h, w))
            )
            if isinstance(m, nn.Conv2d):
                c = m.out_channels
            if h < 1 or w < 1:
                return None
    return (c, h, w)


def min_side(layers: nn.Sequential, channels: int) -> int:
    """Smallest square side the stack accepts (only called on the error path)."""
    for side in range(1, 4097):
        if walk(layers, (channels, side, side)) is not None:
            return side
    return 4097


def features_out(name: str, layers: nn.Sequential, in_shape: Shape) -> Shape:
    out = walk(layers, in_shape)
    if out is None:
        raise ConfigError(
            f"model.name: {name!r} cannot take input shape {in_shape} (C, H, W): its strides/pools "
            f"need height and width >= {min_side(layers, in_shape[0])}"
        )
    return out


def require_min_side(name: str, in_shape: Shape, min_side: int) -> None:
    if in_shape[1] < min_side or in_shape[2] < min_side:
        raise ConfigError(
            f"model.name: {name!r} cannot take input shape {in_shape} (C, H, W): it needs height "
            f"and width >= {min_side}"
        )


def numel(shape: Shape) -> int:
    return shape[0] * shape[1] * shape[2]


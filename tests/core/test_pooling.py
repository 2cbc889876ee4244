"""The fast 2×2 max-pooling gives torch's values at inference and leaves training to torch's own kernel."""

import pytest
import torch
import torch.nn.functional as F

from dpeval.core.models import build_model
from dpeval.core.models.pooling import MaxPool2d, window_max


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("shape", [(3, 4, 14, 14), (2, 3, 5, 5), (2, 3, 15, 8), (3, 7, 6), (1, 1, 2, 2)])
def test_window_max_is_torchs_max_pool(shape, stride):
    x = torch.randn(*shape).tanh()
    x[..., 0, :] = 1.0  # ties, as a saturated tanh gives them
    x.view(-1)[min(5, x.numel() - 1)] = float("nan")
    assert torch.equal(window_max(x, stride).nan_to_num(7.0), F.max_pool2d(x, 2, stride).nan_to_num(7.0))


def test_the_fast_path_runs_only_without_autograd(monkeypatch):
    """With no gradient recorded the slices run; with autograd on, torch's kernel runs and the gradient of tied
    inputs is torch's (all of it to the window's first input, where the maximum of slices would split it)."""
    calls = []
    real = F.max_pool2d
    monkeypatch.setattr(F, "max_pool2d", lambda *a, **k: calls.append(1) or real(*a, **k))
    pool = MaxPool2d(2, stride=1)
    x = torch.ones(1, 1, 3, 3, requires_grad=True)  # every window a tie
    with torch.no_grad():
        pool(x)
    assert calls == []
    pool(x).sum().backward()
    assert calls == [1]
    assert x.grad.tolist() == [[[[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]]]
    split = torch.ones(1, 1, 3, 3, requires_grad=True)
    window_max(split, 1).sum().backward()
    assert not torch.equal(split.grad, x.grad)  # why training keeps torch's kernel
    assert repr(pool) == repr(torch.nn.MaxPool2d(2, stride=1))


@pytest.mark.parametrize("name", ["dpcnn-small", "dpcnn", "cnn2-mnist"])
def test_models_evaluate_as_with_torchs_pooling(name):
    shape = (3, 32, 32) if name == "dpcnn" else (1, 28, 28)
    model = build_model(name, shape, 10, (0.5,) * shape[0], (0.25,) * shape[0]).eval()
    x = torch.rand(16, *shape)
    with torch.no_grad():
        fast = model(x)
    reference = model(x)  # autograd on: torch's kernel
    assert torch.equal(fast, reference.detach())


def test_other_windows_keep_torchs_kernel():
    for pool in (MaxPool2d(3, 1), MaxPool2d(2, 1, padding=1), MaxPool2d(2, 2, ceil_mode=True),
                 MaxPool2d((2, 2), (1, 2))):
        assert not pool.fast()
        x = torch.randn(2, 3, 9, 9)
        with torch.no_grad():
            assert torch.equal(pool(x), F.max_pool2d(x, pool.kernel_size, pool.stride, pool.padding,
                                                     ceil_mode=pool.ceil_mode))

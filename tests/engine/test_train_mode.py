"""Victims and shadow models train in train mode (``train.module_mode``): dropout acts, each example with its own
mask, on both engines, reproducibly; evaluation runs in eval mode; ``eval`` turns it off; a parameter that stops
getting any gradient after the first step is reported once."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import dpeval
from dpeval.core.errors import RunFailure
from dpeval.core.per_sample import PerSampleGradients
from dpeval.defenses.lean_plan import LeanPlan
from dpeval.engine.lean import LeanEngine
from dpeval.engine.lean_kernels import LeanCannotRecompute
from dpeval.engine.training import SilentParameters

SETTINGS = {"data": {"name": "digits", "max_train": 120}, "defense": "dpsgd",
            "train": {"epochs": 2, "batch_size": 40}}
MODES: list[bool] = []  # CountingDropout's mode at every call, in order


class CountingDropout(nn.Dropout):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        MODES.append(self.training)
        return super().forward(x)


def dropout_mlp(in_shape, num_classes):
    c, h, w = in_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 32), nn.ReLU(), CountingDropout(0.5),
                         nn.Linear(32, num_classes))


def same_example(n: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    task = dpeval.load_data(data__name="digits")
    return task.train.x[:1].repeat(n, 1, 1, 1), task.train.y[:1].repeat(n)


def func_norms(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    grads = PerSampleGradients(model)(x, y)
    return torch.stack([g.flatten(1).pow(2).sum(1) for g in grads.values()]).sum(0).sqrt()


def lean_norms(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    found: list[torch.Tensor] = []

    def keep(group, squares, probes):
        found.append(squares)
        return torch.ones_like(squares)

    names = tuple(n for n, p in model.named_parameters() if p.requires_grad)
    LeanEngine(model)(x, y, LeanPlan((names,), keep, sums=False))
    return found[0].sqrt()


@pytest.mark.parametrize("norms", [func_norms, lean_norms], ids=["func", "lean"])
def test_each_example_draws_its_own_dropout_mask_on_both_engines(norms):
    """Twelve copies of one example: in train mode their gradients differ (a mask each), and the same global seed
    draws the same masks; in eval mode they are all one gradient."""
    torch.manual_seed(0)
    model = dropout_mlp((1, 8, 8), 10)
    x, y = same_example()
    model.train()
    torch.manual_seed(1)
    first = norms(model, x, y)
    torch.manual_seed(1)
    assert torch.equal(norms(model, x, y), first)
    assert len(set(first.tolist())) > 6  # per-example masks, not one mask shared by the batch
    model.eval()
    evaluated = norms(model, x, y)
    assert torch.allclose(evaluated, evaluated[0].expand_as(evaluated))


@pytest.mark.parametrize("engine", ["func", "lean"])
def test_a_dropout_model_trains_in_train_mode_evaluates_in_eval_mode_reproducibly(engine):
    MODES.clear()
    first = dpeval.run(dpeval.configure(SETTINGS, train__engine=engine), model=dropout_mlp)
    assert first.extra["train.engine_used"] == engine
    trained = MODES.copy()
    assert True in trained and False in trained  # training passes with dropout, evaluation without
    assert trained[-1] is False  # the accuracy of the final model: eval mode
    again = dpeval.run(dpeval.configure(SETTINGS, train__engine=engine), model=dropout_mlp)
    assert again.utility.test_accuracy == first.utility.test_accuracy
    assert again.utility.train_loss_by_epoch == first.utility.train_loss_by_epoch
    MODES.clear()
    off = dpeval.run(dpeval.configure(SETTINGS, train__engine=engine, train__module_mode="eval"),
                     model=dropout_mlp)
    assert True not in MODES  # `eval`: dropout never acts
    assert off.utility.train_loss_by_epoch != first.utility.train_loss_by_epoch


def test_shadow_models_with_dropout_train_in_train_mode():
    """LiRA's shadow models of a model that draws random numbers in train mode are trained one by one through the
    training loop (nested vmaps cannot draw attention dropout per model and example), each example its own mask."""
    MODES.clear()
    result = dpeval.run({**SETTINGS, "attacks": ["lira"], "attack": {"shadows": 4}}, model=dropout_mlp)
    lira = result.attacks["lira"]
    assert result.status == "done" and lira.error is None and 0 <= lira.metrics["auc"] <= 1
    assert MODES.count(True) > 2  # the victim's and the shadows' training passes


class CachesItsBias(nn.Module):
    """Uses its bias through autograd on the first call only, as a layer caching it outside autograd would."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(width))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += torch.is_grad_enabled()  # training passes only (not the shape check or evaluation)
        return x + (self.bias if self.calls == 1 else self.bias.detach())


def caching_mlp(in_shape, num_classes):
    c, h, w = in_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, num_classes), CachesItsBias(num_classes))


def silent_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "no example's gradient reaches" in r.getMessage()]


def test_a_parameter_that_stops_getting_gradients_is_reported_once(caplog):
    with caplog.at_level(logging.WARNING, logger="dpeval"):
        dpeval.run(dpeval.configure(SETTINGS, train__engine="func"), model=caching_mlp)
    (line,) = silent_warnings(caplog)
    assert line.startswith("step 2:") and "2.bias" in line and "1.weight" not in line
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dpeval"):  # the positive control: a model that trains as written
        dpeval.run(dpeval.configure(SETTINGS, train__engine="func"), model=dropout_mlp)
    assert silent_warnings(caplog) == []


def test_the_watch_skips_empty_steps_and_never_reports_what_the_first_step_did_not_reach():
    watch = SilentParameters()
    watch.see({"a": torch.ones(2), "b": torch.zeros(2)})
    watch.end_step(1)
    watch.end_step(2)  # a Poisson step without examples: nothing seen, nothing said
    watch.see({"a": torch.ones(2), "b": torch.zeros(2)})
    watch.end_step(3)
    assert watch.reported == set()
    watch.see({"a": torch.zeros(2), "b": torch.ones(2)})
    watch.end_step(4)
    assert watch.reported == {"a"}


def test_a_gradient_attacks_victim_release_draws_its_masks_from_the_releases_stream():
    """The victim side of a gradient attack computes its release in the training mode, its masks drawn from the
    release's own stream: the same stream replays it exactly, another draws other masks; ``eval`` draws none."""
    from dpeval.core.streams import Streams
    from dpeval.engine.release import ReleaseOracle
    from dpeval.runner import prepare
    from dpeval.victims import OutsideModel

    torch.manual_seed(0)
    model = dropout_mlp((1, 8, 8), 10)
    prep = prepare(dpeval.configure({**SETTINGS, "defense": "none"}),
                   source=OutsideModel(model, lambda: dropout_mlp((1, 8, 8), 10)))
    x, y = same_example(8)

    def release(mode: str, seed: int) -> torch.Tensor:
        oracle = ReleaseOracle(prep.make_defense, {}, 2, 256, "fp32", mode)
        shared, _ = oracle(model.eval(), x, y, "init", Streams(seed))
        return torch.cat([g.flatten() for g in shared.grads.values()])

    assert torch.equal(release("train", 1), release("train", 1))
    assert not torch.equal(release("train", 1), release("train", 2))
    assert torch.equal(release("eval", 1), release("eval", 2))
    assert not model.training  # the attacker's copy is given back in eval mode


def outside(case: str, **kwargs):
    """A tiny torchvision network with its own dropout or drop-path switched on, for 3-channel inputs."""
    from torchvision.models.swin_transformer import SwinTransformer
    from torchvision.models.vision_transformer import VisionTransformer

    if case == "tv-vit":  # dropout after the embeddings and in the MLPs, and on the attention weights
        return VisionTransformer(image_size=8, patch_size=4, num_layers=1, num_heads=2, hidden_dim=8, mlp_dim=16,
                                 num_classes=3, dropout=0.3, attention_dropout=0.3, **kwargs)
    return SwinTransformer(patch_size=[2, 2], embed_dim=8, depths=[1, 1], num_heads=[1, 2], window_size=[2, 2],
                           num_classes=3, stochastic_depth_prob=0.5, **kwargs)  # drop-path per row


@pytest.mark.parametrize("norms", [func_norms, lean_norms], ids=["func", "lean"])
@pytest.mark.parametrize("case", ["tv-vit", "tv-swin"])
def test_outside_networks_draw_their_dropout_and_drop_path_per_example_on_both_engines(case, norms):
    """torchvision's ViT (dropout, attention dropout) and Swin (stochastic depth, per row): each example its own
    mask on both engines; torch.func cannot draw Swin's in-place drop-path per example, which it says in one line."""
    torch.manual_seed(0)
    model = outside(case)
    x, y = torch.rand(1, 3, 8, 8).repeat(12, 1, 1, 1), torch.zeros(12, dtype=torch.long)
    model.train()
    if case == "tv-swin" and norms is func_norms:
        with pytest.raises(RunFailure, match=r"^train.engine=func: .*StochasticDepth.*train.engine=lean"):
            norms(model, x, y)
        return
    assert len(set(norms(model, x, y).tolist())) >= 3  # a mask shared by the batch: one value (Swin: 2 drop-paths)
    model.eval()
    evaluated = norms(model, x, y)
    torch.testing.assert_close(evaluated, evaluated[0].expand_as(evaluated))


def vit_for_digits(in_shape, num_classes):
    return nn.Sequential(nn.Upsample(size=(8, 8)), nn.Conv2d(in_shape[0], 3, 1),
                         VitHead(num_classes))


class VitHead(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        from torchvision.models.vision_transformer import VisionTransformer

        self.vit = VisionTransformer(image_size=8, patch_size=4, num_layers=1, num_heads=2, hidden_dim=8, mlp_dim=16,
                                     num_classes=num_classes, dropout=0.3, attention_dropout=0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.vit(x)


def test_an_outside_transformer_with_dropout_trains_and_its_shadows_too():
    """A torchvision ViT with dropout on the attention weights and in its MLPs, trained privately (the lean engine,
    chosen by ``auto``) and attacked by LiRA on shadow models trained with their dropout, per model and example
    (nested vmaps fail on its attention dropout)."""
    spec = dpeval.configure({**SETTINGS, "data": {"name": "digits", "max_train": 60}, "attacks": ["lira"],
                             "attack": {"shadows": 4}}, train__epochs=1, train__batch_size=30)
    result = dpeval.run(spec, model=vit_for_digits)
    lira = result.attacks["lira"]
    assert result.extra["train.engine_used"] == "lean" and lira.error is None and 0 <= lira.metrics["auc"] <= 1


def levit_for_digits(in_shape, num_classes):
    from tests.engine.test_lean_zoo import batch_norms_to_group_norms

    timm = pytest.importorskip("timm", reason="timm is an optional extra (pip install dpeval[zoo])")
    levit = timm.create_model("levit_128s", pretrained=False, num_classes=num_classes, img_size=32,
                              embed_dim=(16, 24, 32), key_dim=4, num_heads=(2, 2, 2), depth=(1, 1, 1))
    return nn.Sequential(nn.Upsample(size=(32, 32)), nn.Conv2d(in_shape[0], 3, 1), batch_norms_to_group_norms(levit))


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_levits_attention_biases_train_in_train_mode_and_are_named_in_eval_mode(mode, caplog):
    """timm's LeViT caches its attention-bias lookup in eval mode, so from the second pass on its biases get no
    gradient: trained in train mode they do; trained in eval mode the watch names them."""
    pytest.importorskip("timm", reason="timm is an optional extra (pip install dpeval[zoo])")
    spec = dpeval.configure({**SETTINGS, "data": {"name": "digits", "max_train": 60}}, train__epochs=1,
                            train__batch_size=20, train__module_mode=mode, train__engine="func")
    with caplog.at_level(logging.WARNING, logger="dpeval"):
        dpeval.run(spec, model=levit_for_digits)
    said = silent_warnings(caplog)
    if mode == "train":
        assert said == []
    else:
        (line,) = said
        assert "attention_biases" in line


def zoo_case(case: str) -> tuple[nn.Module, int]:
    """Tiny zoo networks with their own dropout / drop-path switched on."""
    from tests.engine.test_lean_zoo import group_norm

    if case == "tv-mobilenet-v3-gn":  # Dropout(0.5) in its classifier
        from torchvision.models.mobilenetv3 import InvertedResidualConfig, MobileNetV3

        return MobileNetV3([InvertedResidualConfig(8, 3, 16, 8, True, "RE", 2, 1, 1.0)], last_channel=16,
                           num_classes=3, norm_layer=group_norm, dropout=0.5), 8
    timm = pytest.importorskip("timm", reason="timm is an optional extra (pip install dpeval[zoo])")
    if case == "timm-vit":  # dropout after the embeddings, on the attention weights and in the MLPs
        return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3, img_size=8, patch_size=4,
                                 embed_dim=8, depth=1, num_heads=2, drop_rate=0.3, attn_drop_rate=0.3,
                                 proj_drop_rate=0.3), 8
    return timm.create_model("convnext_atto", pretrained=False, num_classes=3, dims=(4, 8, 8, 8),
                             depths=(1, 1, 1, 1), drop_path_rate=0.5), 32  # timm's DropPath draws in place


@pytest.mark.parametrize("norms", [func_norms, lean_norms], ids=["func", "lean"])
@pytest.mark.parametrize("case", ["tv-mobilenet-v3-gn", "timm-vit", "timm-convnext"])
def test_zoo_networks_train_with_their_dropout_per_example(case, norms):
    torch.manual_seed(0)
    model, size = zoo_case(case)
    x, y = torch.rand(1, 3, size, size).repeat(12, 1, 1, 1), torch.zeros(12, dtype=torch.long)
    model.train()
    if case == "timm-convnext" and norms is lean_norms:  # its blocks are recomputed, drop-path included
        with pytest.raises(LeanCannotRecompute, match=r"ConvNeXtBlock.*use train.engine=func"):
            norms(model, x, y)
        return
    assert len(set(norms(model, x, y).tolist())) >= 3


def convnext_for_digits(in_shape, num_classes):
    timm = pytest.importorskip("timm", reason="timm is an optional extra (pip install dpeval[zoo])")
    return nn.Sequential(nn.Upsample(size=(32, 32)), nn.Conv2d(in_shape[0], 3, 1),
                         timm.create_model("convnext_atto", pretrained=False, num_classes=num_classes,
                                           dims=(4, 8, 8, 8), depths=(1, 1, 1, 1), drop_path_rate=0.5))


def test_auto_trains_with_func_where_lean_would_recompute_a_random_draw():
    """``auto`` picks lean for ConvNeXt (a kernel for every layer), which refuses when its first step recomputes a
    block with drop-path: the run goes on with torch.func and says why."""
    pytest.importorskip("timm", reason="timm is an optional extra (pip install dpeval[zoo])")
    spec = dpeval.configure({**SETTINGS, "data": {"name": "digits", "max_train": 40}}, train__epochs=1,
                            train__batch_size=20)
    result = dpeval.run(spec, model=convnext_for_digits)
    assert result.extra["train.engine_used"] == "func"
    assert result.extra["train.engine_reason"].startswith("auto: lean refused when it ran")

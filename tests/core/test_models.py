"""Tests for dpeval.core.models: architectures, shape checks, Normalize, per-sample gradient support."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from dpeval.config import build_spec
from dpeval.core.datasets import load_task, torchvision_sets
from dpeval.core.errors import ConfigError
from dpeval.core.models import Normalize, build_model
from dpeval.core.per_sample import PerSampleGradients
from dpeval.core.registry import DATASETS, MODELS, default_model
from dpeval.core.settings import DataConfig
from tests.helpers import num_params
from tests.torchvision_files import make_cifar10, make_mnist_like, make_svhn, skip_md5

ALL = MODELS.names()
EXPECTED = {"dpcnn", "dpcnn-small", "cnn6", "cnn3", "fcn3", "mlp", "resnet20-gn", "hcnn", "hcnn-small", "vit", "gpt",
            "logreg", "cnn2-mnist", "tanh-cnn-mnist"}
# Models of token sequences (tested below with token inputs); the rest take images.
TOKEN_MODELS = {"gpt"}
IMAGE = [n for n in ALL if n not in TOKEN_MODELS]

# Smallest cheap shape each model accepts; used by the per-sample gradient and seeding tests.
SMALL_SHAPE = {
    "dpcnn": (1, 8, 8),
    "dpcnn-small": (1, 16, 16),
    "cnn6": (3, 8, 8),
    "cnn3": (1, 8, 8),
    "fcn3": (1, 8, 8),
    "mlp": (1, 8, 8),
    "logreg": (1, 8, 8),
    "cnn2-mnist": (1, 16, 16),
    "tanh-cnn-mnist": (1, 28, 28),
    "resnet20-gn": (3, 4, 4),
    "hcnn": (1, 8, 8),
    "hcnn-small": (1, 4, 4),
    "vit": (1, 8, 8),
    "gpt": (1, 1, 6),
}

SHAPES = [(1, 8, 8), (3, 32, 32), (1, 28, 28), (2, 17, 13)]
# dpcnn-small and cnn2-mnist need H, W >= 16; everything else takes all the shapes above.
INVALID = {("dpcnn-small", (1, 8, 8)), ("dpcnn-small", (2, 17, 13)), ("vit", (2, 17, 13)), ("cnn2-mnist", (1, 8, 8)),
           ("cnn2-mnist", (2, 17, 13)), ("tanh-cnn-mnist", (1, 8, 8)), ("tanh-cnn-mnist", (3, 32, 32)),
           ("tanh-cnn-mnist", (2, 17, 13))}
# Models whose fixed scattering front cannot run inside vmap (the engines apply it outside: fixed_front).
FIXED_FRONT = {"hcnn", "hcnn-small"}


def _stats(c: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    return tuple([0.5] * c), tuple([0.25] * c)


def test_registered_names_and_descriptions() -> None:
    assert set(ALL) == EXPECTED
    for name, desc in MODELS.describe().items():
        assert desc and "\n" not in desc, name
    assert set(SMALL_SHAPE) == set(ALL)


def write_fake_data(dataset: str, root: Path, monkeypatch: pytest.MonkeyPatch) -> Path | None:
    """A tiny copy of ``dataset`` under ``root`` (the torchvision ones in their real on-disk formats,
    tests/torchvision_files.py); None for a dataset that needs no files."""
    if dataset in ("digits", "synthetic", "tokens"):
        return None
    if dataset == "textfile":
        (root / "text.txt").write_bytes(bytes(range(256)) * 2)
        return root / "text.txt"
    if dataset in ("mnist", "fashionmnist"):
        monkeypatch.setattr(torchvision_sets, "SYSTEM_FOLDERS", {})  # the fake files, not a system copy
        make_mnist_like(root, {"mnist": "MNIST", "fashionmnist": "FashionMNIST"}[dataset], n_train=20, n_test=10)
    elif dataset == "cifar10":
        skip_md5(monkeypatch, "cifar")
        make_cifar10(root, per_batch=4, n_test=10)
    elif dataset == "svhn":
        skip_md5(monkeypatch, "svhn")
        make_svhn(root, n_train=20, n_test=10)
    elif dataset == "imagefolder":
        from PIL import Image

        for label, colour in (("a", (255, 0, 0)), ("b", (0, 255, 0))):
            (root / label).mkdir()
            for k in range(5):
                Image.new("RGB", (12, 12), colour).save(root / label / f"{k}.png")
    else:
        pytest.fail(f"write_fake_data: add a tiny copy of the new dataset {dataset!r}")
    return root


@pytest.mark.parametrize("dataset", DATASETS.names())
def test_every_dataset_defaults_to_a_model_that_builds_for_it(dataset, tmp_path, monkeypatch) -> None:
    """The rule, not a table: each dataset's declared default model is registered and takes its data's shape."""
    model = default_model(dataset)
    assert model in MODELS
    root = write_fake_data(dataset, tmp_path, monkeypatch)
    cfg = dataclasses.replace(DataConfig(), name=dataset, **({"root": str(root)} if root else {}))
    task = load_task(cfg)
    net = build_model(model, task.shape, task.num_classes, task.mean, task.std, vocab=task.vocab)
    assert net(task.train.x[:2]).shape == (2, task.num_classes)


def test_a_dataset_without_a_default_model_needs_model_name() -> None:
    """An undeclared default is a one-line ConfigError naming model.name, at configuration time, not a KeyError."""
    DATASETS.register("no-default", "a dataset that declares no default model")(lambda cfg: None)
    try:
        with pytest.raises(ConfigError) as err:
            build_spec({"data": {"name": "no-default"}})
        message = str(err.value)
        assert message.startswith("model.name: dataset 'no-default' declares no default model") and "\n" not in message
        with pytest.raises(ConfigError, match="^model.name: dataset 'no-default' declares no default model"):
            default_model("no-default")  # what the runner asks
        assert build_spec({"data": {"name": "no-default"}, "model": {"name": "mlp"}}).model.name == "mlp"
    finally:
        DATASETS.unregister("no-default")


@pytest.mark.parametrize(
    "name,shape,expected",
    [
        ("dpcnn", (3, 32, 32), 550_570),
        ("dpcnn-small", (1, 28, 28), 26_010),
        ("tanh-cnn-mnist", (1, 28, 28), 25_386),
        ("cnn6", (3, 32, 32), 154_266),
        ("hcnn", (3, 32, 32), 187_210),
        ("hcnn-small", (1, 28, 28), 33_066),
    ],
)
def test_exact_param_counts(name: str, shape: tuple[int, int, int], expected: int) -> None:
    net = MODELS.get(name)(shape, 10)
    assert num_params(net) == expected
    full = build_model(name, shape, 10, *_stats(shape[0]))
    # Normalize contributes no parameters, so the wrapped model has the same count.
    assert num_params(full[0], trainable_only=False) == 0
    assert num_params(full) == expected


def test_tanh_cnn_mnist_is_the_anchors_network_and_loads_its_parameters() -> None:
    """``bench/anchor_init.py`` maps the published SmallNetwork's state dict (names net.conv1 … net.fc2) onto
    ``tanh-cnn-mnist``; the loaded model computes the anchor's forward pass (written out below from its code:
    conv → max-pool 2 → tanh twice, 512 → 32 tanh → 10, on (x − 0.1307) / 0.3081)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "bench" / "anchor_init.py"
    module_spec = importlib.util.spec_from_file_location("anchor_init", path)
    anchor_init = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(anchor_init)
    gen = torch.Generator().manual_seed(0)
    shapes = {"net.conv1.weight": (16, 1, 5, 5), "net.conv1.bias": (16,), "net.conv2.weight": (32, 16, 4, 4),
              "net.conv2.bias": (32,), "net.fc1.weight": (32, 512), "net.fc1.bias": (32,),
              "net.fc2.weight": (10, 32), "net.fc2.bias": (10,)}
    theirs = {name: torch.randn(shape, generator=gen) * 0.2 for name, shape in shapes.items()}
    model = build_model("tanh-cnn-mnist", (1, 28, 28), 10, (0.5,), (0.25,))
    model.load_state_dict(anchor_init.convert(theirs))  # strict: every name and shape matches
    x = torch.rand(4, 1, 28, 28, generator=gen)

    def their_forward(x: torch.Tensor) -> torch.Tensor:
        p = theirs
        h = (x - 0.1307) / 0.3081
        h = torch.tanh(F.max_pool2d(F.conv2d(h, p["net.conv1.weight"], p["net.conv1.bias"]), (2, 2)))
        h = torch.tanh(F.max_pool2d(F.conv2d(h, p["net.conv2.weight"], p["net.conv2.bias"]), (2, 2)))
        h = torch.tanh(F.linear(h.view(-1, 512), p["net.fc1.weight"], p["net.fc1.bias"]))
        return F.linear(h, p["net.fc2.weight"], p["net.fc2.bias"])

    with torch.no_grad():
        torch.testing.assert_close(model(x), their_forward(x))
    with pytest.raises(SystemExit, match="net.conv3.weight"):
        anchor_init.convert({"net.conv3.weight": torch.zeros(1)})


def test_num_params_trainable_only() -> None:
    net = MODELS.get("mlp")((1, 2, 2), 3)  # 4*128+128 + 128*3+3 = 1027
    assert num_params(net) == 1027
    net[1].weight.requires_grad_(False)
    assert num_params(net) == 1027 - 512
    assert num_params(net, trainable_only=False) == 1027


def test_flatten_sizes_of_reference_architectures() -> None:
    cnn3 = MODELS.get("cnn3")((1, 8, 8), 10)
    assert cnn3[-1].in_features == 128  # 32 x 2 x 2
    cnn6 = MODELS.get("cnn6")((3, 32, 32), 10)
    assert cnn6[-1].in_features == 3200  # 128 x 5 x 5
    fcn3 = MODELS.get("fcn3")((1, 28, 28), 10)
    assert [m.out_features for m in fcn3 if isinstance(m, nn.Linear)] == [1000, 100, 10]
    assert fcn3[1].in_features == 784


@pytest.mark.parametrize("name", IMAGE)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("classes", [2, 10])
def test_forward_shape(name: str, shape: tuple[int, int, int], classes: int) -> None:
    if (name, shape) in INVALID:
        with pytest.raises(ConfigError, match="model.patch" if name == "vit" else "model.name"):
            build_model(name, shape, classes, *_stats(shape[0]))
        return
    model = build_model(name, shape, classes, *_stats(shape[0]))
    with torch.no_grad():
        out = model(torch.rand(3, *shape))
    assert out.shape == (3, classes)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize(
    "name,shape",
    [
        ("dpcnn", (1, 4, 4)),
        ("dpcnn", (3, 32, 7)),
        ("dpcnn-small", (1, 15, 15)),
        ("resnet20-gn", (3, 3, 3)),
        ("hcnn", (3, 7, 32)),
        ("hcnn-small", (1, 32, 3)),
    ],
)
def test_too_small_input_raises_config_error(name: str, shape: tuple[int, int, int]) -> None:
    with pytest.raises(ConfigError, match=r"model\.name.*" + name) as info:
        build_model(name, shape, 10, *_stats(shape[0]))
    msg = str(info.value)
    assert "\n" not in msg and str(shape) in msg


def test_minimum_sizes_are_exact() -> None:
    # The reported minimum must itself be accepted, and one pixel less rejected.
    MODELS.get("dpcnn-small")((1, 16, 16), 10)
    with pytest.raises(ConfigError, match=">= 16"):
        MODELS.get("dpcnn-small")((1, 15, 16), 10)
    MODELS.get("dpcnn")((1, 8, 8), 10)
    with pytest.raises(ConfigError, match=">= 8"):
        MODELS.get("dpcnn")((1, 8, 7), 10)


@pytest.mark.parametrize("shape,classes", [((3, 32), 10), ((0, 8, 8), 10), ((1, 8, 8), 0)])
def test_bad_shape_or_classes_raise(shape: tuple[int, ...], classes: int) -> None:
    with pytest.raises(ConfigError, match="model.name"):
        MODELS.get("mlp")(shape, classes)  # type: ignore[arg-type]


def test_unknown_model_lists_valid_names() -> None:
    with pytest.raises(ConfigError, match="model.name") as info:
        build_model("vgg99", (3, 32, 32), 10, *_stats(3))
    for name in EXPECTED:
        assert name in str(info.value)


def test_normalize_math_and_buffers() -> None:
    mean, std = (0.1, 0.5, 0.9), (0.2, 0.3, 0.4)
    norm = Normalize(mean, std)
    x = torch.rand(2, 3, 4, 5)
    expected = torch.stack([(x[:, c] - mean[c]) / std[c] for c in range(3)], dim=1)
    torch.testing.assert_close(norm(x), expected)
    assert list(norm.parameters()) == []
    assert {n for n, _ in norm.named_buffers()} == {"mean", "std"}
    assert set(norm.state_dict()) == {"mean", "std"}


def test_normalize_is_first_layer_of_built_model() -> None:
    model = build_model("mlp", (2, 3, 3), 4, (0.5, 0.2), (0.5, 0.1))
    assert isinstance(model, nn.Sequential) and isinstance(model[0], Normalize)
    x = torch.rand(5, 2, 3, 3)
    torch.testing.assert_close(model(x), model[1](model[0](x)))


@pytest.mark.parametrize(
    "mean,std",
    [((0.5, 0.5), (0.2,)), ((), ()), ((0.5,), (0.0,))],
    ids=["length", "empty", "zero-std"],
)
def test_normalize_rejects_bad_stats(mean: tuple[float, ...], std: tuple[float, ...]) -> None:
    with pytest.raises(ConfigError):
        Normalize(mean, std)


def test_build_model_rejects_stats_channel_mismatch() -> None:
    with pytest.raises(ConfigError, match="channel"):
        build_model("mlp", (1, 8, 8), 10, (0.5, 0.5, 0.5), (0.2, 0.2, 0.2))


@pytest.mark.parametrize("name", IMAGE)
def test_no_batchnorm(name: str) -> None:
    shape = (3, 32, 32) if (name, (3, 32, 32)) not in INVALID else SMALL_SHAPE[name]
    model = build_model(name, shape, 10, *_stats(shape[0]))
    bad = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, nn.LazyBatchNorm2d)
    assert not any(isinstance(m, bad) for m in model.modules())
    assert not any("BatchNorm" in type(m).__name__ for m in model.modules())


@pytest.mark.parametrize("name", IMAGE)
def test_per_sample_grads_match_loop(name: str) -> None:
    shape = SMALL_SHAPE[name]
    torch.manual_seed(0)
    model = build_model(name, shape, 5, *_stats(shape[0]))
    x, y = torch.rand(4, *shape), torch.tensor([0, 3, 1, 4])
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def loss(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, (p, buffers), (xi.unsqueeze(0),))
        return F.cross_entropy(out, yi.unsqueeze(0))

    if name in FIXED_FRONT:  # the engines' path: the front outside vmap
        batched = PerSampleGradients(model)(x, y)
    else:
        batched = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    for i in range(4):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        for k, p in model.named_parameters():
            torch.testing.assert_close(
                batched[k][i], p.grad, atol=1e-5, rtol=1e-4, msg=f"{name}:{k}"
            )
    # The samples differ, so their gradients must too (guards against a broadcast bug).
    first = next(iter(batched))
    assert not torch.allclose(batched[first][0], batched[first][1])


@pytest.mark.parametrize("name", IMAGE)
def test_same_seed_same_init(name: str) -> None:
    shape = SMALL_SHAPE[name]

    def weights(seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        return build_model(name, shape, 10, *_stats(shape[0])).state_dict()

    a, b, c = weights(1), weights(1), weights(2)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_opacus_accepts_models() -> None:
    validator = pytest.importorskip("opacus.validators").ModuleValidator
    for name in IMAGE:
        shape = SMALL_SHAPE[name]
        model = build_model(name, shape, 10, *_stats(shape[0]))
        assert validator.validate(model, strict=False) == [], name


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", IMAGE)
def test_opacus_grad_samples_match_loop(name: str) -> None:
    grad_sample_module = pytest.importorskip("opacus").GradSampleModule
    shape = SMALL_SHAPE[name]
    torch.manual_seed(0)
    model = build_model(name, shape, 5, *_stats(shape[0]))
    x, y = torch.rand(4, *shape), torch.tensor([0, 3, 1, 4])
    loop = []
    for i in range(4):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        loop.append({k: p.grad.clone() for k, p in model.named_parameters()})
    model.zero_grad(set_to_none=True)
    wrapped = grad_sample_module(model, loss_reduction="sum")
    F.cross_entropy(wrapped(x), y, reduction="sum").backward()
    for k, p in model.named_parameters():
        assert p.grad_sample is not None, f"{name}:{k} has no Opacus grad_sample"
        for i in range(4):
            torch.testing.assert_close(
                p.grad_sample[i], loop[i][k], atol=1e-5, rtol=1e-4, msg=f"{name}:{k}"
            )


# -- the transformers: settings, shape checks, sample independence --------------------------------------------
def _gpt(settings=None, seq: int = 6, vocab: int = 7, classes: int = 5) -> nn.Module:
    from dpeval.core.settings import ModelConfig

    return build_model("gpt", (1, 1, seq), classes, (0.0,), (1.0,), settings or ModelConfig(), vocab)


def test_transformer_settings_reach_the_modules() -> None:
    from dpeval.core.models.transformers import SelfAttention
    from dpeval.core.settings import ModelConfig

    vit = build_model("vit", (3, 32, 32), 10, *_stats(3), ModelConfig(depth=3, width=48, heads=6, patch=8))
    assert len(vit[1].blocks) == 3 and vit[1].patch.kernel_size == (8, 8) and vit[1].pos.num_embeddings == 16
    assert all(m.heads == 6 for m in vit.modules() if isinstance(m, SelfAttention))
    assert not any(isinstance(m, nn.MultiheadAttention) for m in vit.modules())
    gpt2 = _gpt(ModelConfig(depth=12, width=768, heads=12, seq_len=1024, vocab=50257), seq=128, vocab=256)
    assert len(gpt2[1].blocks) == 12 and gpt2[1].tok.weight.shape == (50257, 768)
    assert gpt2[1].pos.num_embeddings == 1024
    # GPT-2 small's body (124M with tied head; here the head is a 2-class Linear and keys carry no bias)
    body = sum(p.numel() for n, p in gpt2.named_parameters() if not n.startswith("1.head"))
    assert body == 124_439_808 - 12 * 768


@pytest.mark.parametrize("build,field", [
    (lambda M: build_model("vit", (1, 28, 28), 10, *_stats(1), M(patch=5)), "model.patch"),
    (lambda M: build_model("vit", (1, 8, 8), 10, *_stats(1), M(width=30, heads=4)), "model.width"),
    (lambda M: build_model("vit", (1, 8, 8), 10, *_stats(1), M(vocab=10)), "model.vocab"),
    (lambda M: build_model("cnn3", (1, 8, 8), 10, *_stats(1), M(depth=4)), "model.depth"),
    (lambda M: build_model("gpt", (1, 8, 8), 10, *_stats(1), M()), "model.name"),
    (lambda M: build_model("gpt", (1, 1, 8), 10, (0.0,), (1.0,), M()), "model.vocab"),
    (lambda M: _gpt(M(vocab=5)), "model.vocab"),
    (lambda M: _gpt(M(seq_len=4)), "model.seq_len"),
    (lambda M: _gpt(M(patch=2)), "model.patch"),
])
def test_transformer_settings_are_checked(build, field) -> None:
    from dpeval.core.settings import ModelConfig

    with pytest.raises(ConfigError, match=field):
        build(ModelConfig)


def test_gpt_is_causal_and_per_sample() -> None:
    torch.manual_seed(0)
    model = _gpt()
    x = torch.randint(0, 7, (4, 1, 1, 6)).float()
    with torch.no_grad():
        out = model(x)
        other = x.clone()
        other[1:] = (other[1:] + 1) % 7  # the other samples change: sample 0's output does not
        assert torch.equal(model(other)[0], out[0])
        # causal: the last position's state depends on earlier tokens, and no earlier position sees later ones
        h = model[1].tok(x.reshape(4, -1).long()) + model[1].pos(torch.arange(6).expand(4, -1))
        h2 = model[1].tok(other.reshape(4, -1).long()) + model[1].pos(torch.arange(6).expand(4, -1))
        h2[0, :3] = h[0, :3]
        h2[0, 3:] = h[0, 3:] + 1
        a, b = model[1].blocks(h[:1]), model[1].blocks(h2[:1])
        assert torch.allclose(a[0, :3], b[0, :3]) and not torch.allclose(a[0, 3:], b[0, 3:])
    assert out.shape == (4, 5) and not torch.allclose(out[0], out[1])


@pytest.mark.parametrize("name", ["vit", "gpt"])
def test_transformer_per_sample_grads_match_loop(name: str) -> None:
    torch.manual_seed(0)
    if name == "gpt":
        model, x = _gpt(), torch.randint(0, 7, (4, 1, 1, 6)).float()
    else:
        model, x = build_model("vit", (1, 8, 8), 5, *_stats(1)), torch.rand(4, 1, 8, 8)
    y = torch.tensor([0, 3, 1, 4])
    batched = PerSampleGradients(model)(x, y)
    for i in range(4):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        for k, p in model.named_parameters():
            torch.testing.assert_close(batched[k][i], p.grad, atol=1e-5, rtol=1e-4, msg=f"{name}:{k}")


def test_the_papers_small_models_have_their_parameter_counts() -> None:
    """AdaCliP's logistic regression (784·10 + 10), Abadi et al.'s network after DP-PCA to 60 (60·1000 + 1000 +
    1000·10 + 10), GEP's MNIST CNN (dpcnn-small's convolutions, then one linear layer of 32·4·4 → 10)."""
    mnist = ((1, 28, 28), 10, (0.5,), (0.25,))
    assert num_params(build_model("logreg", *mnist)) == 7_850
    assert num_params(build_model("cnn2-mnist", *mnist)) == 1_040 + 8_224 + 5_130
    wide = dataclasses.replace(build_spec({}).model, width=1000, activation="relu")
    pca_mlp = build_model("mlp", (60, 1, 1), 10, (0.0,) * 60, (1.0,) * 60, wide)
    assert num_params(pca_mlp) == 71_010 and any(isinstance(m, nn.ReLU) for m in pca_mlp.modules())
    assert any(isinstance(m, nn.Tanh) for m in build_model("mlp", *mnist).modules())  # the default stays tanh, 128
    assert num_params(build_model("mlp", *mnist)) == 784 * 128 + 128 + 1290


def test_a_setting_a_model_does_not_read_is_refused_naming_what_it_reads() -> None:
    spec = build_spec({})
    with pytest.raises(ConfigError, match=r"model.depth: model 'mlp' takes only model.width, model.activation"):
        build_model("mlp", (1, 28, 28), 10, (0.5,), (0.25,), dataclasses.replace(spec.model, depth=2))
    with pytest.raises(ConfigError, match=r"model.activation: model 'vit' takes only model.depth"):
        build_model("vit", (1, 8, 8), 10, (0.5,), (0.25,), dataclasses.replace(spec.model, activation="relu"))
    with pytest.raises(ConfigError, match=r"model.width: model 'logreg' takes no shape settings"):
        build_model("logreg", (1, 8, 8), 10, (0.5,), (0.25,), dataclasses.replace(spec.model, width=3))

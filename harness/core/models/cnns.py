"""The plain networks: Tanh CNNs of the DP literature, the R-GAP CNNs / FCN, an MLP and logistic regression.

Each factory: (in_shape, num_classes) -> nn.Module taking (B, C, H, W)."""

from __future__ import annotations

from torch import nn

from dpeval.core.errors import ConfigError
from dpeval.core.models._shapes import Shape, check_in_shape, features_out, numel, takes_settings
from dpeval.core.models.pooling import MaxPool2d
from dpeval.core.registry import MODELS
from dpeval.core.settings import ModelConfig


@MODELS.register("dpcnn", "Tanh CNN of Papernot et al. (550K params at 3x32x32); needs H, W >= 8")
def dpcnn(in_shape: Shape, num_classes: int) -> nn.Module:
    in_shape = check_in_shape("dpcnn", in_shape, num_classes)
    c = in_shape[0]
    features = nn.Sequential(
        nn.Conv2d(c, 32, 3, padding=1), nn.Tanh(),
        nn.Conv2d(32, 32, 3, padding=1), nn.Tanh(),
        MaxPool2d(2, 2),
        nn.Conv2d(32, 64, 3, padding=1), nn.Tanh(),
        nn.Conv2d(64, 64, 3, padding=1), nn.Tanh(),
        MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.Tanh(),
        nn.Conv2d(128, 128, 3, padding=1), nn.Tanh(),
        MaxPool2d(2),
    )  # fmt: skip
    flat = numel(features_out("dpcnn", features, in_shape))
    return nn.Sequential(
        *features, nn.Flatten(), nn.Linear(flat, 128), nn.Tanh(), nn.Linear(128, num_classes)
    )


@MODELS.register(
    "dpcnn-small", "Tramer & Boneh tanh CNN for 28x28 grayscale (26K params); needs H, W >= 16"
)
def dpcnn_small(in_shape: Shape, num_classes: int) -> nn.Module:
    in_shape = check_in_shape("dpcnn-small", in_shape, num_classes)
    c = in_shape[0]
    features = nn.Sequential(
        nn.Conv2d(c, 16, 8, stride=2, padding=2), nn.Tanh(),
        MaxPool2d(2, stride=1),
        nn.Conv2d(16, 32, 4, stride=2, padding=0), nn.Tanh(),
        MaxPool2d(2, stride=1),
    )  # fmt: skip
    flat = numel(features_out("dpcnn-small", features, in_shape))
    return nn.Sequential(
        *features, nn.Flatten(), nn.Linear(flat, 32), nn.Tanh(), nn.Linear(32, num_classes)
    )


@MODELS.register(
    "tanh-cnn-mnist", "The MNIST tanh CNN of Dörmann et al. 2021 that Annamalai & De Cristofaro 2024 audit: conv "
                      "16@5x5, max-pool 2, tanh, conv 32@4x4, max-pool 2, tanh, 512 -> 32 tanh -> classes (25,386 "
                      "params at 1x28x28); needs 1x28x28"
)
def tanh_cnn_mnist(in_shape: Shape, num_classes: int) -> nn.Module:
    """Layer for layer the anchor's ``SmallNetwork`` (convolution, then pooling, then tanh; no padding, pooling of
    stride 2), so that its published initial parameters load (their names mapped by ``bench/anchor_init.py``)."""
    in_shape = check_in_shape("tanh-cnn-mnist", in_shape, num_classes)
    if tuple(in_shape) != (1, 28, 28):
        raise ConfigError(f"model.name: tanh-cnn-mnist needs 1x28x28 inputs (its 512 features are 32x4x4); the "
                          f"data has shape {tuple(in_shape)}")
    return nn.Sequential(
        nn.Conv2d(1, 16, 5), MaxPool2d(2), nn.Tanh(),
        nn.Conv2d(16, 32, 4), MaxPool2d(2), nn.Tanh(),
        nn.Flatten(), nn.Linear(512, 32), nn.Tanh(), nn.Linear(32, num_classes),
    )  # fmt: skip


@MODELS.register(
    "cnn6", "R-GAP CNN6 (Zhu & Blaschko): 6 bias-free convs, LeakyReLU(0.2), strides, no pooling"
)
def cnn6(in_shape: Shape, num_classes: int) -> nn.Module:
    in_shape = check_in_shape("cnn6", in_shape, num_classes)
    c = in_shape[0]
    # Convs are bias-free as in R-GAP (the closed-form attack solves W x = y layer by layer);
    # this is also what gives the reference 154,266 parameters at 3x32x32 / 10 classes.
    specs = [(c, 12, 4, 2, 2), (12, 36, 3, 2, 1), (36, 36, 3, 1, 1), (36, 36, 3, 1, 1),
             (36, 64, 3, 2, 1), (64, 128, 3, 1, 1)]  # fmt: skip
    layers: list[nn.Module] = []
    for cin, cout, k, s, p in specs:
        layers += [nn.Conv2d(cin, cout, k, stride=s, padding=p, bias=False), nn.LeakyReLU(0.2)]
    features = nn.Sequential(*layers)
    flat = numel(features_out("cnn6", features, in_shape))
    return nn.Sequential(*features, nn.Flatten(), nn.Linear(flat, num_classes, bias=True))


@MODELS.register("cnn3", "3-conv strided LeakyReLU CNN for 8x8 digits; attackable by IG and R-GAP")
def cnn3(in_shape: Shape, num_classes: int) -> nn.Module:
    in_shape = check_in_shape("cnn3", in_shape, num_classes)
    c = in_shape[0]
    # Bias-free convs follow the R-GAP convention (as cnn6) so the closed-form attack applies as-is.
    features = nn.Sequential(
        nn.Conv2d(c, 16, 3, stride=1, padding=1, bias=False), nn.LeakyReLU(0.2),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.LeakyReLU(0.2),
        nn.Conv2d(32, 32, 3, stride=2, padding=1, bias=False), nn.LeakyReLU(0.2),
    )  # fmt: skip
    flat = numel(features_out("cnn3", features, in_shape))
    return nn.Sequential(*features, nn.Flatten(), nn.Linear(flat, num_classes))


@MODELS.register("fcn3", "R-GAP FCN3: Linear(CHW->1000->100->classes) with LeakyReLU(0.2)")
def fcn3(in_shape: Shape, num_classes: int) -> nn.Module:
    in_shape = check_in_shape("fcn3", in_shape, num_classes)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(numel(in_shape), 1000), nn.LeakyReLU(0.2),
        nn.Linear(1000, 100), nn.LeakyReLU(0.2),
        nn.Linear(100, num_classes),
    )  # fmt: skip


@MODELS.register("mlp", "One-hidden-layer MLP; settings width (hidden units, 128) and activation (tanh | relu); "
                        "Abadi et al.'s MNIST network with width 1000, relu after DP-PCA")
@takes_settings("width", "activation")
def mlp(in_shape: Shape, num_classes: int, settings: ModelConfig | None = None, vocab: int | None = None) -> nn.Module:
    in_shape = check_in_shape("mlp", in_shape, num_classes)
    settings = settings if settings is not None else ModelConfig()
    width = settings.width or 128
    activation = {"tanh": nn.Tanh, "relu": nn.ReLU}[settings.activation or "tanh"]
    return nn.Sequential(
        nn.Flatten(), nn.Linear(numel(in_shape), width), activation(), nn.Linear(width, num_classes)
    )


@MODELS.register("logreg", "Multinomial logistic regression: one Linear(C·H·W -> classes), softmax in the loss "
                           "(AdaCliP's MNIST model: 7,850 parameters)")
def logreg(in_shape: Shape, num_classes: int) -> nn.Module:
    in_shape = check_in_shape("logreg", in_shape, num_classes)
    return nn.Sequential(nn.Flatten(), nn.Linear(numel(in_shape), num_classes))


@MODELS.register("cnn2-mnist", "GEP's MNIST CNN: two tanh convs with max-pooling and one linear layer (14K params "
                               "at 1x28x28; dpcnn-small without its hidden linear layer); needs H, W >= 16")
def cnn2_mnist(in_shape: Shape, num_classes: int) -> nn.Module:
    """The GEP paper's MNIST model is "two convolutional layers with max-pooling and one fully connected layer",
    widths not given (nor in its code, which has only the CIFAR-10 ResNet). Chosen: the convolutions and pooling of
    Tramèr & Boneh's / Papernot et al.'s 28×28 CNN (``dpcnn-small``: 16 filters 8×8 stride 2, 32 filters 4×4
    stride 2, 2×2 max-pooling of stride 1 after each, tanh), then the one linear layer to the classes."""
    in_shape = check_in_shape("cnn2-mnist", in_shape, num_classes)
    features = nn.Sequential(
        nn.Conv2d(in_shape[0], 16, 8, stride=2, padding=2), nn.Tanh(),
        MaxPool2d(2, stride=1),
        nn.Conv2d(16, 32, 4, stride=2, padding=0), nn.Tanh(),
        MaxPool2d(2, stride=1),
    )  # fmt: skip
    flat = numel(features_out("cnn2-mnist", features, in_shape))
    return nn.Sequential(*features, nn.Flatten(), nn.Linear(flat, num_classes))

"""The settings of a run other than the defense's and the attacks' own parameters, declared once.

Each field carries its default, allowed values and help text (``dpeval.core.params.param``): validation,
``dpeval list`` and the tables of docs/configuration.md all read them from here. The run's assembly
(``dpeval.core.spec.RunSpec``) nests these dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpeval.core.params import Params, param

DEFAULT_EPSILON = 3.0
MAX_EPOCHS = 100_000  # training epochs, and `dpeval privacy --epochs` (larger counts only hang the accountant)


@dataclass
class SyntheticConfig(Params):
    """Shape, classes and size of the synthetic dataset (class prototypes plus noise)."""

    shape: list[int] = param(factory=lambda: [1, 8, 8], help="`synthetic`: C, H, W")
    classes: int = param(10, "`synthetic`: number of classes", low=2)
    size: int = param(1000, "`synthetic`: number of examples (at least `classes`)", low=1)


@dataclass
class TokensConfig(Params):
    """The synthetic token-sequence dataset: one random prototype sequence per class, tokens redrawn at random."""

    length: int = param(16, "`tokens`: tokens per sequence", low=1)
    vocab: int = param(32, "`tokens`: vocabulary size (token ids 0 … vocab−1)", low=2)
    classes: int = param(4, "`tokens`: number of classes", low=2)
    size: int = param(1000, "`tokens`: number of sequences (at least `classes`)", low=1)
    noise: float = param(0.5, "`tokens`: chance that each token of a sequence is redrawn uniformly", low=0, high=1)


@dataclass
class DataConfig(Params):
    """Which dataset to load and how its roles (private train pool, test, public) are split."""

    name: str = param("digits", "dataset (flag `--dataset`); `dpeval list` shows them")
    root: str = param("./data", "torchvision datasets' folder, or the class-folder root for `imagefolder`")
    download: bool = param(False, "let torchvision download into `data.root` (needs network)")
    split_seed: int = param(0, "the split permutation; independent of `seed`, so the member population is "
                               "fixed across training seeds", low=0, high=2**63, high_open=True)
    test_fraction: float = param(0.2, "held-out test share, for datasets without an official test split",
                                 low=0, high=1, high_open=True)
    public_fraction: float = param(0.1, "public/auxiliary share carved from the training source (of "
                                        "`public_source` when that is set)", low=0, high=1, high_open=True)
    public_source: str | None = param(None, "another dataset whose training images form the public split (its "
                                            "`public_fraction` share, converted to this dataset's channels and "
                                            "size); null = a share of this dataset's own training source",
                                      added=True)
    max_train: int = param(0, "cap on the private pool (0 = all); smaller caps are prefixes of larger ones",
                           low=0)
    max_test: int = param(0, "cap on the held-out test split (0 = all): quicker evaluation (CIFAR-10's 10,000 test "
                             "images cost a minute of ScatterNet features on one core) and fewer non-members for the "
                             "membership attacks; a prefix of the (shuffled) split", low=0, added=True)
    normalize: str = param("auto", "inputs as the model sees them: `auto` = (x − mean) / std per channel with the "
                                   "public split's statistics (0.5 / 0.25 without a public split); `none` = the "
                                   "pixels in [0, 1] as loaded", choices=("auto", "none"), added=True)
    image_size: int = param(32, "`imagefolder`: resize the shorter side, centre-crop to this square", low=4)
    synthetic: SyntheticConfig = param(factory=SyntheticConfig, help="the synthetic dataset")
    tokens: TokensConfig = param(factory=TokensConfig, help="the synthetic token-sequence dataset", added=True)


ACTIVATIONS = ("tanh", "relu")  # what `mlp` may put between its layers


@dataclass
class PCAConfig(Params):
    """DP-PCA of the inputs in front of the network (``dpeval.core.pca``)."""

    dims: int = param(0, "project the (normalised, flattened) inputs onto this many principal directions of the "
                         "private pool, computed with the Gaussian mechanism and accounted; 0 = no PCA", low=0)
    epsilon_share: float = param(0.1, "the share f of `privacy.epsilon` for the PCA: its noise makes the PCA "
                                      "alone (f·ε, δ)-DP, and training's σ makes both together (ε, δ)-DP",
                                 low=0, high=1, low_open=True, high_open=True)
    noise_multiplier: float | None = param(None, "σ_p of the PCA itself instead of a share (needed with "
                                                 "`privacy.noise_multiplier`)", low=0, low_open=True)


@dataclass
class ModelConfig(Params):
    """Model registry name (``None``: the dataset's default model) and the shape settings of the models that take
    them.

    The shape settings are read by the models that declare them (``vit`` and ``gpt``: depth, width, heads, patch,
    seq_len, vocab; ``mlp``: width, activation); ``None`` means the model's default, and a setting given to a
    model that does not take it is refused."""

    name: str | None = param(None, "model (flag `--model`); null = the dataset's default model")
    depth: int | None = param(None, "`vit`, `gpt`: transformer blocks; null = 2", low=1, added=True)
    width: int | None = param(None, "`vit`, `gpt`: token width, divisible by `heads`; null = 64. `mlp`: hidden "
                                    "units; null = 128", low=1, added=True)
    heads: int | None = param(None, "`vit`, `gpt`: attention heads; null = 4", low=1, added=True)
    patch: int | None = param(None, "`vit`: patch side, dividing the image's height and width; null = 4", low=1,
                              added=True)
    seq_len: int | None = param(None, "`gpt`: positions, at least the data's sequence length; null = that "
                                      "length", low=1, added=True)
    vocab: int | None = param(None, "`gpt`: vocabulary size, at least the data's; null = the data's", low=1, added=True)
    activation: str | None = param(None, "`mlp`: the hidden layer's activation; null = tanh", choices=ACTIVATIONS,
                                   added=True)
    pca: PCAConfig = param(factory=PCAConfig, help="DP-PCA of the inputs before the network (any model)",
                           added=True)
    weights: str | None = param(None, "a state-dict file (`torch.save(model.state_dict())`) of this model trained "
                                      "elsewhere: the run attacks it instead of training (flag `--weights`); the "
                                      "privacy settings and `train` then describe how it was trained", added=True)

    SHAPE = ("depth", "width", "heads", "patch", "seq_len", "vocab", "activation")  # read by the model factories

    def given(self) -> dict[str, int | str]:
        """The shape settings that are set (not ``None``)."""
        return {k: getattr(self, k) for k in self.SHAPE if getattr(self, k) is not None}


@dataclass
class PrivacyConfig(Params):
    """Target privacy, or a fixed noise multiplier whose ε is reported.

    One of ``epsilon`` / ``noise_multiplier`` drives a DP run: with ``epsilon`` σ is calibrated, with
    ``noise_multiplier`` the ε of that σ is reported. Neither given: ε = 3. ``delta: null`` applies the
    rule in ``dpeval.core.accounting``.
    """

    epsilon: float | None = param(None, "target ε: σ is calibrated so the accounted ε ≤ target (within "
                                        "0.5%); 3 when `noise_multiplier` is not given", low=0, low_open=True)
    delta: float | None = param(None, "target δ; null = min(1e-5, 1/(2N))", low=0, high=1, low_open=True,
                                high_open=True)
    noise_multiplier: float | None = param(None, "fixed σ whose ε is reported; exclusive with `epsilon`",
                                           low=0, low_open=True)
    accountant: str = param("rdp", "Opacus accountant", choices=("rdp", "prv"))

    def validate(self) -> None:
        from dpeval.core.errors import ConfigError

        if self.epsilon is not None and self.noise_multiplier is not None:
            raise ConfigError("privacy.noise_multiplier: give either privacy.epsilon (σ is calibrated) or "
                              "privacy.noise_multiplier (its ε is reported), not both")


@dataclass
class TrainConfig(Params):
    """Victim training. Defaults are tuned for the embedded digits data (see docs/configuration.md):
    Adam at lr 0.01 serves both DP-SGD (≈0.91 test accuracy at ε = 3) and the non-private baseline (≈0.97);
    the papers' SGD recipes are in configs/papers/."""

    epochs: int = param(20, "training epochs (flag `--epochs`)", low=1, high=MAX_EPOCHS)
    batch_size: int = param(128, "logical batch size B (at most the private pool); q = B/N", low=1)
    physical_batch_size: int = param(256, "micro-batch for per-sample gradients (bounds memory, never "
                                          "changes results)", low=1)
    optimizer: str = param("adam", "optimizer", choices=("sgd", "adam"))
    lr: float = param(0.01, "learning rate", low=0, low_open=True)
    momentum: float = param(0.0, "SGD momentum (SGD only)", low=0, high=1, high_open=True)
    weight_decay: float = param(0.0, "L2 weight decay", low=0)
    lr_schedule: str = param("constant", "`cosine`: anneal to 0 over all steps; `step`: ×0.1 at 50% and "
                                         "75% of the steps; `half`: ×0.1 at 50% only",
                             choices=("constant", "cosine", "step", "half"))
    sampling: str = param("poisson", "`poisson`: each example joins each batch with probability q (what "
                                     "the accountant assumes); `shuffle`: a permutation per epoch cut into "
                                     "⌊N/B⌋ batches of exactly B (the papers' convention)",
                          choices=("poisson", "shuffle"))
    engine: str = param("auto", "per-sample engine: `func` materialises per-sample gradients (torch.func); "
                                "`lean` forms clipped sums during backprop (book-keeping); `auto` = `lean` "
                                "where the defense and model allow it, except on a CUDA device where one "
                                "micro-batch of per-sample gradients fits in a quarter of its memory (`func` "
                                "is faster there)", choices=("auto", "func", "lean"))
    precision: str = param("fp32", "`bf16`: per-sample forward and backward passes under bfloat16 autocast "
                                   "(`func` engine; `auto` picks it); gradients, clipping, sums and noise stay "
                                   "float32, so the clip bound and the accounting are exact; evaluation, GEP's "
                                   "public anchors and the attacker's own passes stay float32",
                           choices=("fp32", "bf16"), added=True)
    module_mode: str = param("train", "the module mode the victim and shadow models train in: `train` (dropout and "
                                      "drop-path act, a fresh mask per example and step, drawn from the run's "
                                      "`global` stream); `eval` (every such layer off, for models that must train "
                                      "in eval mode); evaluation always runs in eval mode",
                             choices=("train", "eval"), added=True)
    checkpoint_every: int = param(0, "besides the checkpoint at every epoch's end, one every N optimizer steps "
                                     "within an epoch (for long epochs; resume goes on from it bit-identically); "
                                     "0 = at epoch ends only; not part of the run key", low=0, keyed=False)

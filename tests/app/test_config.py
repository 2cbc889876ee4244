"""RunSpec validation, canonical form and run key."""

import re

import pytest

from dpeval.config import build_spec, load_yaml, parse_set, set_dotted
from dpeval.core.errors import ConfigError
from dpeval.core.settings import DEFAULT_EPSILON


def spec_from(**sets):
    raw = {}
    for key, value in sets.items():
        set_dotted(raw, key.replace("__", "."), value)
    return build_spec(raw)


def test_defaults():
    spec = build_spec({})
    assert spec.defense_name == "dpsgd"
    assert spec.defense.clip == 1.0
    assert spec.data.name == "digits"
    assert spec.privacy.epsilon == DEFAULT_EPSILON
    assert spec.attacks == []


@pytest.mark.parametrize("key,value,field", [
    ("privacy.epsilon", -1, "privacy.epsilon"),
    ("privacy.epsilon", 0, "privacy.epsilon"),
    ("privacy.delta", 1, "privacy.delta"),
    ("privacy.delta", 0, "privacy.delta"),
    ("train.epochs", 0, "train.epochs"),
    ("train.batch_size", 0, "train.batch_size"),
    ("train.physical_batch_size", 0, "train.physical_batch_size"),
    ("train.lr", -0.1, "train.lr"),
    ("train.momentum", 1.0, "train.momentum"),
    ("train.optimizer", "rmsprop", "train.optimizer"),
    ("train.sampling", "random", "train.sampling"),
    ("train.epochs", "ten", "train.epochs"),
    ("train.epochs", 2.5, "train.epochs"),
    ("data.download", "yes", "data.download"),
    ("privacy.accountant", "gdp", "privacy.accountant"),
    ("device", "tpu", "device"),
    ("defense.clip", 0, "defense.clip"),
    ("nope", 1, "nope"),
    ("train.nope", 1, "train.nope"),
    ("defense.final_rate", 0.5, "defense.final_rate"),
    ("defense.name", "nope", "defense"),
    ("attacks", ["nope"], "attack"),
])
def test_invalid_values_name_the_field(key, value, field):
    raw = {}
    set_dotted(raw, key, value)
    with pytest.raises(ConfigError) as info:
        build_spec(raw)
    message = str(info.value)
    assert message.startswith(field), message
    assert "\n" not in message


def test_unknown_key_lists_valid_ones():
    with pytest.raises(ConfigError, match="valid keys here: epochs, batch_size"):
        spec_from(train__epoch=3)


def test_unknown_defense_lists_registered():
    with pytest.raises(ConfigError, match="dpsgd") as info:
        spec_from(defense__name="nope")
    assert "none" in str(info.value)


def test_epsilon_and_noise_multiplier_are_exclusive():
    with pytest.raises(ConfigError, match="privacy.noise_multiplier"):
        spec_from(privacy__epsilon=1.0, privacy__noise_multiplier=1.0)
    spec = spec_from(privacy__noise_multiplier=1.0)
    assert spec.privacy.epsilon is None


def test_attack_none_means_no_attack():
    assert spec_from(attacks=["none"]).attacks == []


def test_run_key_is_stable_and_sensitive():
    a, b = build_spec({}), build_spec({})
    assert a.run_key == b.run_key and len(a.run_key) == 16
    assert spec_from(seed=1).run_key != a.run_key
    assert spec_from(defense__clip=0.5).run_key != a.run_key
    assert spec_from(device="cpu").run_key == a.run_key  # where it runs is not what it is
    # Explicitly giving a default changes nothing.
    assert spec_from(train__epochs=a.train.epochs).run_key == a.run_key


def test_parse_set_uses_yaml_scalars():
    assert parse_set(["a.b=1", "c=0.5", "d=true", "e=null", "f=[1, 2]", "g=text"]) == [
        ("a.b", 1), ("c", 0.5), ("d", True), ("e", None), ("f", [1, 2]), ("g", "text")]
    with pytest.raises(ConfigError, match="--set"):
        parse_set(["novalue"])


def test_ints_accepted_for_floats():
    assert spec_from(train__lr=1).train.lr == 1.0


def test_yaml_loading(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("train:\n  epochs: 2\ndefense:\n  name: dpsgd\n  clip: 0.5\n")
    spec = build_spec(load_yaml(good))
    assert spec.train.epochs == 2 and spec.defense.clip == 0.5
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [epochs: 2\n")
    with pytest.raises(ConfigError, match="malformed YAML"):
        load_yaml(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_yaml(tmp_path / "missing.yaml")
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_yaml(scalar)


@pytest.mark.parametrize("text,message", [
    ("train: {epochs: 1}\nseed: 1\ntrain: {epochs: 2}\n", "duplicate key 'train' (first given at line 1)"),
    ("train: {epochs: 1, epochs: 2}\n", "duplicate key 'epochs'"),
    ("", "is empty"),
    ("# just a comment\n", "is empty"),
])
def test_yaml_refuses_duplicate_keys_and_empty_files(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_yaml(path)


def test_yaml_merge_keys_may_still_override(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("base: &b {epochs: 1, batch_size: 64}\ntrain: {<<: *b, epochs: 3}\n")
    assert load_yaml(path)["train"] == {"epochs": 3, "batch_size": 64}


def test_binary_file_names_the_option(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(bytes(range(128, 256)))
    with pytest.raises(ConfigError, match=r"^SWEEP_FILE: .* is not a UTF-8 text"):
        load_yaml(path, "SWEEP_FILE")


def test_every_shipped_config_loads_and_validates():
    """The strict loader accepts every recipe in configs/, and the RS / random-freeze recipes train with
    plain SGD (docs/sparsification.md)."""
    from pathlib import Path

    from dpeval.sweep.grid import load_sweep

    configs = Path(__file__).resolve().parents[2] / "configs"
    for path in sorted(configs.glob("*.yaml")):
        spec = build_spec(load_yaml(path))
        if spec.defense_name in ("rs", "random-freeze"):
            assert (spec.train.optimizer, spec.train.momentum) == ("sgd", 0.0), path.name
    for path in sorted((configs / "sweeps").glob("*.yaml")):
        assert load_sweep(path), path.name
    assert {s.train.optimizer for s in load_sweep(configs / "sweeps" / "rs_rates.yaml")} == {"sgd"}


def test_benchmark_recipes_share_one_training_recipe():
    """The benchmark's private rows differ only in their defense (docs/benchmark.md: no defense tuned more than
    another); every file, the learning-rate grid included, is a valid sweep."""
    import json
    from pathlib import Path

    from dpeval.sweep.grid import load_sweep

    folder = Path(__file__).resolve().parents[2] / "configs" / "benchmark" / "fashionmnist"
    sweeps = {path.stem: load_sweep(path) for path in sorted(folder.glob("*.yaml"))}
    assert {"none", "dpsgd", "rs", "random-freeze", "gep", "adaclip", "groupwise-all", "groupwise-layer"} <= set(sweeps)
    private = {name: points for name, points in sweeps.items() if name not in ("none", "tuning-lr")}
    recipes = {json.dumps({k: s.canonical()[k] for k in ("train", "data", "model")}, sort_keys=True)
               for points in private.values() for s in points}
    assert len(recipes) == 1, recipes
    tuned = {s.train.lr for s in sweeps["tuning-lr"]}
    assert next(iter(private.values()))[0].train.lr in tuned and len(tuned) > 1


def test_yaml_cannot_construct_objects(tmp_path):
    evil = tmp_path / "evil.yaml"
    evil.write_text("seed: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError, match="malformed YAML"):
        load_yaml(evil)


def test_exponent_floats_from_yaml_and_set(tmp_path):
    spec = build_spec({"train": {"lr": "1e-3"}})
    assert spec.train.lr == 0.001
    (key, value), = parse_set(["train.lr=5e-3"])
    raw = {}
    set_dotted(raw, key, value)
    assert build_spec(raw).train.lr == 0.005
    with pytest.raises(ConfigError, match="train.lr"):
        build_spec({"train": {"lr": "fast"}})
    with pytest.raises(ConfigError, match="train.lr"):
        build_spec({"train": {"lr": "inf"}})


def test_defense_that_needs_public_data_fails_before_the_run(tmp_path):
    from click.testing import CliRunner

    from dpeval.cli import main

    results = tmp_path / "r"
    result = CliRunner().invoke(main, ["run", "--defense", "gep", "--set", "data.public_fraction=0",
                                       "--results", str(results)])
    assert result.exit_code == 2 and "data.public_fraction" in result.stderr
    assert not results.exists()


def test_an_attack_parameter_may_drop_the_attack_prefix():
    """``attack.ig.iterations`` is ``attack.ig.ig_iterations`` (the same run key); both at once is refused."""
    from dpeval.config import build_spec

    short = build_spec({"attacks": ["ig", "lira"], "attack": {"ig": {"iterations": 7}, "restarts": 2}})
    assert short.attack["ig"].ig_iterations == 7 and short.attack["ig"].ig_restarts == 2
    assert short.run_key == build_spec({"attacks": ["ig", "lira"],
                                        "attack": {"ig": {"ig_iterations": 7}, "ig_restarts": 2}}).run_key
    with pytest.raises(ConfigError, match="attack.ig.ig_iterations: the same setting as attack.ig.iterations"):
        build_spec({"attacks": ["ig"], "attack": {"ig": {"iterations": 7, "ig_iterations": 8}}})
    with pytest.raises(ConfigError, match="attack.iterations: unknown setting"):
        build_spec({"attacks": ["lira"], "attack": {"iterations": 7}})


def test_the_doubled_spelling_is_accepted_with_a_note():
    from dpeval.cli import spelling_notes

    notes = spelling_notes({"attack": {"ig": {"ig_iterations": 5, "targets": 2}, "ig_restarts": 2}})
    assert notes == ["dpeval: note: attack.ig.ig_iterations can be written attack.ig.iterations (the same setting; "
                     "results keep the key attack.ig.ig_iterations)"]
    assert spelling_notes({"attack": {"ig": {"iterations": 5}}}) == []


def test_a_setting_added_later_keeps_stored_run_keys():
    """Settings that arrived after results were stored: at their defaults the key is the hash of the
    configuration without them (what earlier versions hashed); set, they are keyed like any setting."""
    import hashlib
    import json

    spec = build_spec({"data": {"name": "fashionmnist"}, "defense": {"name": "none"}})  # no data-set defaults
    content = {k: v for k, v in spec.canonical().items() if k != "device"}
    assert content.pop("defaults") == []
    assert content["data"].pop("normalize") == "auto" and content["train"].pop("checkpoint_every") == 0
    assert content["data"].pop("tokens")["length"] == 16
    assert [content["model"].pop(k) for k in ("depth", "width", "heads", "patch", "seq_len", "vocab", "activation")] \
        == [None] * 7
    assert content["model"].pop("pca")["dims"] == 0 and content["data"].pop("public_source") is None
    assert content["model"].pop("weights") is None and content["train"].pop("precision") == "fp32"
    assert content["train"].pop("module_mode") == "train"
    assert content["data"].pop("max_test") == 0
    earlier = hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
                             .encode()).hexdigest()[:16]
    assert spec.run_key == earlier
    assert spec_from(data__normalize="auto").run_key == build_spec({}).run_key
    assert spec_from(data__normalize="none").run_key != build_spec({}).run_key
    assert spec_from(data__tokens__length=8).run_key != build_spec({}).run_key
    assert spec_from(data__max_test=100).run_key != build_spec({}).run_key
    assert spec_from(train__checkpoint_every=5).run_key == build_spec({}).run_key  # cannot change results
    assert spec_from(train__precision="bf16").run_key != build_spec({}).run_key
    assert spec_from(train__module_mode="eval").run_key != build_spec({}).run_key
    assert spec_from(model__name="vit", model__depth=3).run_key != spec_from(model__name="vit").run_key
    with pytest.raises(ConfigError, match="data.normalize"):
        spec_from(data__normalize="dataset")

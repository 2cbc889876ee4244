"""``dpeval run`` deltas against a reference run: the matching ``none`` / ``dpsgd`` run of the results folder,
run first when ``--reference`` asks for one that is not there."""

import json

from click.testing import CliRunner

from dpeval.cli import main
from dpeval.config import build_spec
from dpeval.core.verdicts import Verdict
from dpeval.reference import find_reference
from dpeval.results import RunResult
from dpeval.store import ResultStore

QUICK = ["--epochs", "1", "--set", "train.batch_size=64", "--quiet",
         "--set", "data.name=synthetic", "--set", "data.synthetic.size=200"]


def run(results, *args):
    result = CliRunner().invoke(main, ["run", *args, "--results", str(results), *QUICK], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def test_reference_is_run_when_absent_then_found(tmp_path):
    out = json.loads(run(tmp_path, "--defense", "rs", "--reference", "none", "--json").stdout)
    rows = ResultStore(tmp_path).rows("done")
    assert sorted(r["metrics"]["defense"] for r in rows) == ["none", "rs"]  # the reference was run
    delta = out["reference"]["none"]
    none = next(r for r in rows if r["metrics"]["defense"] == "none")
    assert delta["run_id"] == none["run_id"]
    assert delta["utility.test_accuracy"] == out["utility.test_accuracy"] - none["metrics"]["utility.test_accuracy"]
    text = run(tmp_path, "--defense", "rs", "--seed", "0").stdout  # no option: the stored reference is used
    assert "vs none" in text and "test accuracy" in text and "Δ" in text
    assert len(ResultStore(tmp_path).rows("done")) == 3  # nothing else was run


def test_a_reference_must_share_data_model_training_and_seed(tmp_path):
    run(tmp_path, "--defense", "none", "--seed", "1")
    run(tmp_path, "--defense", "none", "--set", "train.lr=0.05")
    text = run(tmp_path, "--defense", "rs").stdout
    assert "vs none" not in text  # another seed, another learning rate: no match
    runs = ResultStore(tmp_path).results("done")
    spec = build_spec({"defense": "rs", "data": {"name": "synthetic", "synthetic": {"size": 200}},
                       "train": {"epochs": 1, "batch_size": 64}, "seed": 1, "privacy": {"epsilon": 8.0}})
    assert find_reference(runs, spec, "none") is not None  # a non-private reference ignores privacy settings
    assert find_reference(runs, spec, "dpsgd") is None


def test_deltas_name_both_headlines_and_the_direction_of_leakage():
    from dpeval.reference import deltas, format_deltas

    mine = {"defense": "rs", "utility.test_accuracy": 0.85, "attack.ig.targets": 6, "leakage.ig.psnr": 7.6,
            "leakage.ig.baseline_psnr": 12.1, "leakage.ig.verdict": Verdict.NO_LEAK}
    ref = RunResult.from_flat({**mine, "run_id": "ref", "defense": "none", "utility.test_accuracy": 0.97,
                               "leakage.ig.psnr": 27.3, "leakage.ig.verdict": Verdict.LEAKS})
    delta = deltas(mine, ref)
    assert delta["utility.test_accuracy"] == 0.85 - 0.97 and delta["leakage.ig.psnr"] == 7.6 - 27.3
    text = "\n".join(format_deltas(mine, ref))
    assert "IG PSNR 7.6 vs 27.3 dB: Δ -19.7 dB (less leakage; verdicts no-leak-detected vs leaks)" in text
    other = RunResult.from_flat({**ref.flat(), "attack.ig.targets": 3})
    assert "leakage.ig.psnr" not in deltas(mine, other)  # another attack setting: no leakage delta

"""Every paper recipe (configs/papers/*.yaml) runs end to end for one step on tiny files written in the real
torchvision on-disk formats, and the leaderboard shows the paper's number beside the measured one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dpeval.cli import main
from dpeval.sweep.grid import PaperNumbers, load_paper, load_sweep
from tests.torchvision_files import make_cifar10, make_mnist_like, make_svhn, skip_md5

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "configs" / "papers").glob("*.yaml"))
TUNING = sorted((ROOT / "configs" / "papers" / "tuning").glob("*.yaml"))
REPRODUCING = ROOT / "docs" / "reproducing.md"
TINY = 8  # private examples = batch size: one step per epoch


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    make_cifar10(root, per_batch=4, n_test=6)
    make_svhn(root, n_train=20, n_test=6)
    make_mnist_like(root, "MNIST", n_train=20, n_test=6)
    make_mnist_like(root, "FashionMNIST", n_train=20, n_test=6)
    return root


def first_of_grid(tree: dict) -> dict:
    """The grid's first configuration: every swept (list-valued) setting at its first value."""
    return {k: first_of_grid(v) if isinstance(v, dict) else v[:1] if isinstance(v, list) and k != "attacks" else v
            for k, v in tree.items()}


def shrunk(recipe: Path, data_root: Path) -> dict:
    """The recipe's first configuration with one seed, one epoch of one step on the tiny files; everything else as
    written."""
    raw = first_of_grid(yaml.safe_load(recipe.read_text()))
    raw["seeds"] = [0]
    raw["data"].update(root=str(data_root), max_train=TINY)
    raw["train"].update(epochs=1, batch_size=TINY, physical_batch_size=TINY)
    if raw["defense"]["name"] == "gep":
        raw["defense"].update(num_bases=4, num_anchors=4, anchor_batch_size=4)
    return raw


def test_there_is_a_recipe_per_documented_row() -> None:
    assert len(RECIPES) >= 40
    doc = REPRODUCING.read_text()
    for recipe in RECIPES:
        assert recipe.stem in doc, f"docs/reproducing.md does not list {recipe.name}"


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_header_and_paper_section(recipe: Path) -> None:
    text = recipe.read_text()
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert len(header) >= 5, recipe.name
    assert "Guessed" in text or "Nothing guessed" in text, f"{recipe.name} must say which values were guessed"
    columns = load_paper(recipe)
    assert {"paper.source", "paper.table", "paper.row", "paper.test_accuracy"} <= set(columns)
    percent = f"{columns['paper.test_accuracy'] * 100:g}"
    assert percent in header[0], (percent, header[0])  # the title line states the reported number
    specs = load_sweep(recipe)
    seeds = sorted({s.seed for s in specs})
    assert len(seeds) >= 3 and seeds == list(range(len(seeds)))  # every cell at 3 seeds or more
    configurations = len(specs) // len(seeds)  # a tuned cell holds its grid (the best is reported, with its price)
    assert len(specs) == configurations * len(seeds)
    assert configurations == 1 or "grid" in text, f"{recipe.name}: a tuned recipe says how its grid was chosen"
    assert specs[0].data.root == "./data" and specs[0].privacy.delta is not None


@pytest.mark.parametrize("grid", TUNING, ids=lambda p: p.stem)
def test_tuning_grids_are_valid_seed_zero_grids_named_by_their_recipes(grid: Path) -> None:
    """A tuning grid (stage 1 of a tuned cell) expands to valid runs at seed 0 only, carries its cell's paper
    section, and the recipe of its cell names it (the recipe's header says how its values were chosen)."""
    specs = load_sweep(grid)
    assert {s.seed for s in specs} == {0} and len(specs) >= 2
    columns = load_paper(grid)
    assert {"paper.source", "paper.table", "paper.row", "paper.test_accuracy"} <= set(columns)
    assert any(grid.name in recipe.read_text() for recipe in RECIPES), f"no recipe names {grid.name}"


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_runs_one_step(recipe: Path, data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("cifar", "svhn", "mnist"):
        skip_md5(monkeypatch, module)
    small = tmp_path / recipe.name
    small.write_text(yaml.safe_dump(shrunk(recipe, data_root), allow_unicode=True))
    results = tmp_path / "results"
    out = CliRunner().invoke(main, ["sweep", str(small), "--results", str(results), "--quiet", "--json"],
                             catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["done"] == 1
    board = CliRunner().invoke(main, ["leaderboard", "--results", str(results), "--group-seeds", "--json"])
    (row,) = json.loads(board.stdout)
    paper = load_paper(recipe)
    assert row["paper.test_accuracy"] == paper["paper.test_accuracy"]
    assert row["paper.table"] == paper["paper.table"]
    assert 0.0 <= row["utility.test_accuracy"] <= 1.0 and row["privacy.steps"] == 1
    spec = load_sweep(recipe)[0]
    assert (row["dataset"], row["model"], row["defense"]) == (spec.data.name, spec.model.name, spec.defense_name)
    if spec.privacy.epsilon is not None:  # a recipe at a given σ reports the ε it spends
        assert row["privacy.epsilon"] <= spec.privacy.epsilon


def test_paper_fields_are_documented() -> None:
    doc = REPRODUCING.read_text()
    for name in PaperNumbers.__dataclass_fields__:
        assert f"`{name}`" in doc, name


# -- the paper columns: validation, placement in the leaderboard / report --------------------------------
def test_paper_section_is_validated_and_outside_the_run_key(tmp_path: Path) -> None:
    base = {"data": {"name": "digits"}, "defense": {"name": "dpsgd"}, "seeds": [0]}
    plain, annotated = tmp_path / "plain.yaml", tmp_path / "annotated.yaml"
    plain.write_text(yaml.safe_dump(base))
    annotated.write_text(yaml.safe_dump({**base, "paper": {"table": "Table 9", "test_accuracy": 0.5,
                                                             "test_accuracy_sem": 0.01}}))
    assert load_sweep(plain)[0].run_key == load_sweep(annotated)[0].run_key
    assert load_paper(annotated) == {"paper.table": "Table 9", "paper.test_accuracy": 0.5,
                                     "paper.test_accuracy.sem": 0.01, "paper.accuracy_is": "unstated"}
    for bad, field in (({"test_accuracy": 70.0}, "paper.test_accuracy"), ({"tabel": "x"}, "tabel"),
                       ({"accuracy_is": "median"}, "paper.accuracy_is")):
        broken = tmp_path / "broken.yaml"
        broken.write_text(yaml.safe_dump({**base, "paper": bad}))
        out = CliRunner().invoke(main, ["sweep", str(broken), "--results", str(tmp_path / "r")])
        assert out.exit_code == 2 and field in out.output and "Traceback" not in out.output
        assert not (tmp_path / "r" / "results.sqlite").exists()


def test_leaderboard_and_report_put_the_paper_beside_the_measured(tmp_path: Path) -> None:
    import csv
    import io

    from dpeval import leaderboard as lb
    from dpeval.report.tables import table
    from tests.helpers import typed

    def row(seed: int, acc: float) -> dict:
        metrics = {"dataset": "cifar10", "model": "hcnn", "defense": "rs", "attack": "none", "seed": seed,
                   "privacy.epsilon": 3.0, "utility.test_accuracy": acc, "comm.density": 0.55,
                   "utility.test_accuracy_by_epoch": [acc - 0.1, acc + 0.02, acc],
                   "paper.table": "Table 2", "paper.test_accuracy": 0.7, "paper.test_accuracy.sem": 0.0011,
                   "paper.accuracy_is": "unstated", "paper.density": 0.55}
        return {"run_id": f"r{seed}", "run_key": f"k{seed}", "status": "done", "metrics": metrics,
                "config": {"defense": {"name": "rs"}, "seed": seed}}

    rows = [row(0, 0.68), row(1, 0.70)]
    grouped = lb.leaderboard(typed(rows), seeds_grouped=True)
    (record,) = grouped
    assert record["paper.test_accuracy"] == 0.7 and record["paper.test_accuracy.sem"] == 0.0011
    assert record["utility.best_test_accuracy"] == pytest.approx(0.71)  # mean over seeds of the best epoch
    handle = io.StringIO()
    lb.write_csv(grouped, handle)
    header = next(csv.reader(io.StringIO(handle.getvalue())))
    at = header.index("utility.test_accuracy")
    assert header[at + 1:at + 5] == ["utility.best_test_accuracy", "paper.test_accuracy", "paper.test_accuracy.sem",
                                     "paper.accuracy_is"]
    assert header[header.index("comm.density") + 1] == "paper.density"
    text = lb.format_table(grouped).splitlines()
    columns = text[0].split()
    assert columns[columns.index("utility.test_accuracy") + 1:][:2] == ["utility.best_test_accuracy",
                                                                       "paper.test_accuracy"]
    assert "0.7 ± 0.0011" in text[1]
    assert '<th title="paper.test_accuracy">paper.test_accuracy</th>' in table(grouped)[1]
    # without a paper number nothing moves
    plain = [{**r, "metrics": {k: v for k, v in r["metrics"].items() if not k.startswith("paper.")}} for r in rows]
    assert "paper.test_accuracy" not in lb.format_table(lb.leaderboard(typed(plain)))

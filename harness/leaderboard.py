"""Leaderboard rows from the store's typed results (``ResultStore.results``): one row per ``done`` run with the
result keys of docs/results.md, flattened here (``flat_row``), where the rows are printed and written.

``group_seeds`` aggregates runs that differ only in their seed: metric columns (utility, leakage, comm,
time) become the mean, with ``<column>.sem`` (standard error of the mean, sample std / √n) beside those
whose values vary, plus ``n`` and ``seeds``; configuration columns keep their common value; verdicts
become ``leaks`` / ``no-leak-detected`` when every seed agrees and ``mixed (k/n leak)`` otherwise. Runs
with the same run key (the same configuration and seed, run again) count once: the latest is kept.

``pareto.<attack>`` marks the utility–leakage Pareto front under the attack's declared headline, and only
where the point beats the attack's data-free baseline (its verdict is ``leaks``; without a verdict, its
headline beats the declared baseline or chance level): configurations with no detected leakage all tie
at "no leakage" — they can dominate a leaking configuration (as accurate, less leakage) but are not
ranked among themselves by differences that lie within the baseline's noise.

``privacy.selection_*`` prices the choice itself: a best configuration picked among k DP configurations
trained on the same private data is the output of all k trainings, so its ε is not one run's ε. Per
dataset with at least two DP configurations (non-DP baselines, ε = inf, are not candidates), every DP
record gets ``privacy.selection_configs`` (k), ``privacy.selection_epsilon`` / ``.selection_delta`` (plain
composition over all the runs: Σε, Σδ) and, where every run's σ, q and T are known (the subsampled
Gaussian), ``privacy.selection_epsilon_random_stopping`` / ``.selection_delta_random_stopping`` with
``privacy.selection_random_stopping`` naming the distribution: what the selection would cost had the
configurations been tried by Papernot & Steinke's random stopping with as many trials on average
(``dpeval.core.accounting.random_stopping_cost``). ``selection_sentences`` says it in words.
"""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import marshal
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator, TextIO

from dpeval.core.accounting import composition, gaussian_rdp, random_stopping_cost
from dpeval.core.errors import ConfigError, brief, printable
from dpeval.core.result_keys import AttackKey
from dpeval.core.verdicts import Verdict
from dpeval.headlines import (  # noqa: F401 (re-exported)
    attacks_in,
    finite,
    fmt,
    headline,
    headline_label,
    is_number,
    read,
)
from dpeval.results import RunResult
from dpeval.store import ResultStore

LEADING = [
    "run_id", "run_key", "status", "dataset", "model", "defense", "attack", "seed",
    "privacy.epsilon", "privacy.delta", "privacy.noise_multiplier", "privacy.sample_rate", "privacy.steps",
    "privacy.accountant", "utility.test_accuracy", "utility.train_accuracy",
    "comm.density", "comm.bytes_sparse", "comm.bytes_dense", "time.train_s", "time.attack_s",
]
METRIC_PREFIXES = ("utility.", "leakage.", "comm.", "time.")  # averaged over seeds, with .sem
CELL_LIMIT = 60  # characters of a terminal table cell (a stored string can be any length)
TERMINAL = ["run_id", "dataset", "model", "defense", "attack", "seed", "privacy.epsilon", "utility.test_accuracy"]
SELECTION = ["privacy.selection_epsilon", "privacy.selection_epsilon_random_stopping"]  # beside ε in the table
# A paper recipe's numbers (configs/papers/, ``paper:``) sit beside the measured column they quote, with the
# best epoch's accuracy (what papers that report "best accuracy" compare with); BRIEF: what the terminal table
# and the report add (the CSV adds them all).
PAPER_BESIDE = {"utility.test_accuracy": ["utility.best_test_accuracy", "paper.test_accuracy",
                                          "paper.test_accuracy.sem", "paper.accuracy_is"],
                "comm.density": ["paper.density"]}
BRIEF = {"utility.best_test_accuracy", "paper.test_accuracy"}


def with_paper(columns: list[str], present: set[str], brief: bool = False) -> list[str]:
    """``columns`` with each measured column followed by the ``present`` columns that PAPER_BESIDE puts beside
    it; unchanged when no record carries a paper number."""
    if not any(c.startswith("paper.") for c in present):
        return columns
    out = []
    for c in columns:
        out += [c, *(p for p in PAPER_BESIDE.get(c, [])
                     if p in present and p not in columns and (p in BRIEF or not brief))]
    return out


def flat_row(result: RunResult) -> dict[str, Any]:
    """A run as one flat record: its scalar result keys (``RunResult.flat``; lists such as per-epoch curves are left
    out), plus its ``train.*`` / ``data.*`` settings and requested ε (``setting_columns``, from its stored
    configuration) and a digest of its results (``results_digest``, what ``mark_identical`` compares)."""
    metrics = dict(sorted(result.flat().items()))  # in name order, as the store keeps a run's keys
    flat = {"run_id": result.run_id, "run_key": result.run_key, "status": result.status}
    flat.update({k: v for k, v in metrics.items() if not isinstance(v, (list, dict))})
    curve = metrics.get("utility.test_accuracy_by_epoch")
    if curve and all(finite(v) for v in curve):  # what papers that report the best epoch compare with
        flat["utility.best_test_accuracy"] = max(curve)
    dp = finite(flat.get("privacy.epsilon"))
    for key, value in setting_columns(result.config, dp).items():
        flat.setdefault(key, value)
    flat["results_digest"] = results_digest(metrics)
    return flat


def _flatten(tree: dict[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}.{key}")
        else:
            yield f"{prefix}.{key}", value


NOT_SETTINGS = {"data.name", "data.root", "data.download"}  # the dataset column; where files lie


def setting_columns(config: dict[str, Any], dp: bool) -> dict[str, Any]:
    """A run's ``train.*``, ``data.*`` and ``model.*`` settings that apply to it, flat (lists as comma-joined text),
    and ``privacy.target_epsilon``, the ε it asked for (DP runs calibrated to a target ε only). Settings that do
    not apply are left out: SGD momentum under Adam, the synthetic data's shape for another dataset, the
    image size outside ``imagefolder``, a model setting left at null (the model's default), the DP-PCA's settings
    of a model without one."""
    data, model = config.get("data") or {}, config.get("model") or {}
    dataset = data.get("name")
    skip = set(NOT_SETTINGS) | {"model.name"}  # the `model` column
    if (config.get("train") or {}).get("optimizer") != "sgd":
        skip.add("train.momentum")
    if dataset != "imagefolder":
        skip.add("data.image_size")
    pca = (model.get("pca") or {}).get("dims") if isinstance(model.get("pca"), dict) else None
    flat = {}
    for section, tree in (("train", config.get("train") or {}), ("data", data), ("model", model)):
        for key, value in _flatten(tree, section):
            if key in skip or (section == "model" and (value is None or (not pca and key.startswith("model.pca.")))) \
                    or (section == "data" and dataset != "synthetic" and key.startswith("data.synthetic.")):
                continue
            flat[key] = ", ".join(map(str, value)) if isinstance(value, list) else value
    target = (config.get("privacy") or {}).get("epsilon")
    if dp and is_number(target):
        flat["privacy.target_epsilon"] = target
    return flat


def results_digest(metrics: dict[str, Any]) -> str:
    """A hash of everything a run measured (utility and leakage, per-epoch curves included): two runs with
    the same digest gave the same results."""
    measured = sorted((k, v) for k, v in metrics.items() if k.startswith(("utility.", "leakage.")))
    try:  # floats as their 8 bytes, a third of writing them as text; version 2 writes no back-references
        data = marshal.dumps(measured, 2)
    except ValueError:  # a value marshal cannot write (an enum member set by code): written as a store holds it
        data = marshal.dumps([tuple(item) for item in json.loads(json.dumps(measured, default=str))], 2)
    return hashlib.sha256(data).hexdigest()[:12]


def group_key(result: RunResult) -> str:
    """The run's configuration without its seed (and where it ran): runs that share it are one seed group."""
    config = {k: v for k, v in result.config.items() if k not in ("seed", "device", "defaults")}
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def latest_per_key(results: list[RunResult]) -> list[RunResult]:
    """One run per run key, the last one (runs come in start order): a configuration run again at the
    same seed is one observation, not two."""
    return list({result.run_key: result for result in results}.values())


def group_seeds(results: list[RunResult]) -> list[dict[str, Any]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for result in latest_per_key(results):
        groups.setdefault(group_key(result), []).append(flat_row(result))
    out = []
    for key, members in groups.items():
        members.sort(key=lambda m: (str(type(m.get("seed"))), m.get("seed")))
        agg: dict[str, Any] = {"group_key": key, "n": len(members),
                               "seeds": " ".join(str(m.get("seed")) for m in members)}
        columns = {c for m in members for c in m}
        for col in sorted(columns - {"run_id", "run_key", "seed"}):
            values = [m.get(col) for m in members]
            if col.startswith(METRIC_PREFIXES) and all(is_number(v) for v in values):
                finite_values = [v for v in values if math.isfinite(v)]
                agg[col] = statistics.fmean(values) if len(finite_values) == len(values) else values[0]
                if len(finite_values) > 1 and len(set(finite_values)) > 1:  # a spread only where values vary
                    agg[f"{col}.sem"] = standard_error(finite_values)
            elif (key := AttackKey.parse(col)) is not None and key.is_verdict:
                merged = Verdict.merge(values)
                agg[col] = None if merged is None else str(merged)
            else:
                distinct = {str(v) for v in values}
                agg[col] = values[0] if len(distinct) == 1 else "|".join(sorted(distinct))
        out.append(agg)
    return out


def standard_error(values: list[float]) -> float:
    """The standard error of the mean (sample standard deviation / √n) in floating point: ``statistics.stdev``
    sums exact fractions, a quarter of a 10,000-run leaderboard's time."""
    n = len(values)
    mean = math.fsum(values) / n
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1) / n)


def ordered_columns(records: list[dict[str, Any]]) -> list[str]:
    present = {c for r in records for c in r}
    lead = with_paper([c for c in ["group_key", "n", "seeds", *LEADING] if c in present or c in LEADING], present)
    rest = sorted(present - set(lead))
    return lead + rest


# A spreadsheet evaluates a cell that starts with one of these as a formula (=HYPERLINK(...), +cmd|...).
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> str:
    """A CSV cell: numbers as Python writes them; text (settings, paper references, anything a store holds) with a
    leading ' where it would start a formula, unless it is a number written as text (-0.5)."""
    if value is None:
        return ""
    if isinstance(value, float):
        return "inf" if value == math.inf else repr(value)
    text = str(value)
    if isinstance(value, str) and text.startswith(FORMULA_START) and not _number_text(text):
        return "'" + text
    return text


def _number_text(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def write_csv(records: list[dict[str, Any]], handle: TextIO) -> None:
    columns = ordered_columns(records)
    writer = csv.writer(handle)
    writer.writerow([_cell(c) for c in columns])
    for record in records:
        writer.writerow([_cell(record.get(c)) for c in columns])


def mark_pareto(records: list[dict[str, Any]]) -> None:
    """Set ``pareto.<attack>``: True when the record beats the attack's data-free baseline and no other
    configuration has test accuracy ≥ and leakage ≤ (one of them strictly) under that attack's headline
    metric, every configuration without detected leakage counting as "no leakage" (see the module
    docstring); records without the metric are left out."""
    keys = {c for r in records for c in r}
    for attack in attacks_in(records):
        if headline(keys, attack) is None:
            continue
        points = []
        for r in records:
            acc, h = r.get("utility.test_accuracy"), read(r, attack)
            if not (finite(acc) and h is not None and is_number(h.value)):  # NaN: no test set, no accuracy
                continue
            beats = h.leaks is not False
            leak = (h.value if h.higher_leaks else -h.value) if beats else -math.inf
            points.append((r, acc, leak, beats))
        for (r, _, _, beats), dominated in zip(points, dominated_points([(acc, leak) for _, acc, leak, _ in points])):
            r[f"pareto.{attack}"] = beats and not dominated


def dominated_points(points: list[tuple[float, float]]) -> list[bool]:
    """For each (accuracy, leakage) point, whether another has accuracy ≥ and leakage ≤, one of them strictly (a
    NaN leakage neither dominates nor is dominated). A sweep from the most accurate, keeping the least leakage
    seen at higher accuracy: n log n (comparing every pair is 10⁸ comparisons for 10,000 runs)."""
    order = sorted(range(len(points)), key=lambda i: -points[i][0])
    out = [False] * len(points)
    least_above = None  # the least leakage of the points more accurate than those at hand (None: there are none)
    for _, group in itertools.groupby(order, key=lambda i: points[i][0]):
        tied = list(group)
        least_here = min((points[i][1] for i in tied if not math.isnan(points[i][1])), default=None)
        for i in tied:
            leak = points[i][1]
            out[i] = ((least_above is not None and least_above <= leak)
                      or (least_here is not None and leak > least_here))
        if least_here is not None:
            least_above = least_here if least_above is None else min(least_above, least_here)
    return out


def sort_records(records: list[dict[str, Any]], column: str, descending: bool) -> list[dict[str, Any]]:
    if records and not any(column in r for r in records):
        raise ConfigError(f"--sort: no column {brief(column)}; columns: {', '.join(ordered_columns(records))}")

    def missing(r: dict[str, Any]) -> bool:
        value = r.get(column)
        return value is None or (is_number(value) and math.isnan(value))  # NaN: not measured (no test set)

    present = [r for r in records if not missing(r)]
    ordered = sorted(present, key=lambda r: (0, r[column], "") if is_number(r[column]) else (1, 0, str(r[column])),
                     reverse=descending)
    return ordered + [r for r in records if missing(r)]  # rows without the value go last either way


SETTING_PREFIXES = ("defense.", "attack.", "train.", "data.", "model.", "privacy.target_epsilon", "privacy.delta",
                    "privacy.accountant")
NOT_VARYING = {"data.train_size", "data.test_size", "data.public_size", "train.engine_used",
               "train.engine_reason"}  # results, not settings
DP_ONLY = ("privacy.",)  # settings that mean nothing for a non-private run


def applies(record: dict[str, Any], column: str) -> bool:
    """Whether a setting bears on this record: it carries it, and a ``privacy.*`` setting only where the run
    is private (finite ε)."""
    if column not in record:
        return False
    return not column.startswith(DP_ONLY) or finite(record.get("privacy.epsilon"))


def varying_settings(records: list[dict[str, Any]]) -> list[str]:
    """The settings (``defense.*``, ``attack.*``, ``train.*``, ``data.*``, ``model.*``, requested ε, δ, accountant)
    whose value differs between the records they apply to: what was swept, or what differs in the recipe. A
    setting that only some records carry (another defense's or attack's) is not a sweep, and two defenses'
    parameters of the same name (GEP's and groupwise's ``groups``) are not one setting."""
    keys = {c for c in set().union(*records) if c.startswith(SETTING_PREFIXES) and not c.endswith(".sem")
            and c not in NOT_VARYING}
    private = [r for r in records if finite(r.get("privacy.epsilon"))]
    by_defense: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_defense[r.get("defense")].append(r)
    out = []
    for c in keys:
        # a defense's parameter is compared among that defense's runs only, every other setting among all runs;
        # a privacy setting among the private runs only (``applies``)
        pools = by_defense.values() if c.startswith("defense.") else [private] if c.startswith(DP_ONLY) else [records]
        if any(_differ([r[c] for r in pool if c in r]) for pool in pools):
            out.append(c)
    return sorted(out)


def _differ(values: list[Any]) -> bool:
    """Whether the values are not all one, as written: 1, 1.0 and True differ, two NaNs do not. Their written
    forms are compared only where values or types differ (a 10,000-run table would write each)."""
    try:
        same = len(set(values)) <= 1 and len({type(v) for v in values}) <= 1
    except TypeError:  # unhashable
        same = False
    return not same and len({repr(v) for v in values}) > 1


def mark_identical(records: list[dict[str, Any]]) -> None:
    """``identical_results``: the same short id on records of different configurations whose results are
    the same (every utility and leakage value, per-epoch curves included; with seeds grouped, every seed's);
    the digest column is dropped."""
    owners: dict[str, set[str]] = {}
    for r in records:
        owners.setdefault(str(r.get("results_digest")), set()).add(str(r.get("group_key") or r.get("run_key")))
    for r in records:
        digest = str(r.pop("results_digest", None))
        if len(owners.get(digest, ())) > 1:
            r["identical_results"] = digest[:8]


def format_table(records: list[dict[str, Any]]) -> str:
    if not records:
        return "(no finished runs)"
    grouped = "n" in records[0]
    keys = {c for r in records for c in r}
    varying = varying_settings(records)
    leak = [c for a in attacks_in(records) if (h := headline(keys, a))
            for c in (h[0], str(AttackKey.verdict(a))) if c in keys]
    pareto = sorted(c for c in keys if c.startswith("pareto.")) + [c for c in ("identical_results",) if c in keys]
    base = [c for c in TERMINAL if c != "seed" and c in keys | set(TERMINAL)]
    chosen = [c for c in SELECTION if c in keys]
    base[base.index("privacy.epsilon") + 1:base.index("privacy.epsilon") + 1] = chosen
    if grouped:
        base = ["n", *[c for c in base if c != "run_id"], "seeds"]
    else:
        base.insert(base.index("attack") + 1, "seed")
    columns = base[:base.index("attack") + 1] + varying + base[base.index("attack") + 1:] + leak + pareto
    columns = with_paper(columns, keys, brief=True)

    def show(r: dict[str, Any], c: str) -> str:
        v = r.get(c)
        if v is None:
            return ""
        if isinstance(v, float):
            text = fmt(v)
            if grouped and is_number(sem := r.get(f"{c}.sem")) and math.isfinite(v):  # a spread in grouped rows only
                return f"{text} ± {sem:.2g}"
            return text
        if isinstance(v, bool):
            return "*" if v else ""
        return printable(v, CELL_LIMIT)

    cells = [[show(r, c) for c in columns] for r in records]
    columns = [printable(c, CELL_LIMIT) for c in columns]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def selection_group(record: dict[str, Any]) -> str:
    """What a best configuration is chosen among: the runs of one dataset — of one paper recipe's cell when the
    runs come from a recipe (its ``paper.table`` and ``paper.row``: a tuned cell's grid), so that several tuned
    cells in one results folder are priced each on its own grid."""
    cell = [str(record[k]) for k in ("paper.table", "paper.row") if record.get(k)]
    return f"{record.get('dataset')} ({', '.join(cell)})" if cell else str(record.get("dataset"))


def selection_costs(results: list[RunResult]) -> dict[str, dict[str, Any]]:
    """Per dataset (per recipe cell: ``selection_group``) with ≥ 2 DP configurations among the finished runs: the
    privacy cost of selecting one of them on the private data (module docstring)."""
    configs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for result in latest_per_key([r for r in results if r.status == "done"]):
        m = result.flat()  # the privacy keys as recorded: a run of an older version may lack a σ, q or T
        if finite(m.get("privacy.epsilon")):
            configs.setdefault(selection_group(m), {}).setdefault(group_key(result), []).append(m)
    out = {}
    for dataset, groups in configs.items():
        if len(groups) < 2:
            continue
        runs = [m for members in groups.values() for m in members]
        deltas = [float(m.get("privacy.delta") or 0.0) for m in runs]
        eps, delta = composition([float(m["privacy.epsilon"]) for m in runs], deltas)
        cost: dict[str, Any] = {"dataset": dataset, "configs": len(groups), "runs": len(runs),
                                "run_epsilon": max(float(m["privacy.epsilon"]) for m in runs),
                                "run_delta": max(deltas), "epsilon": eps, "delta": delta}
        curves = []
        for members in groups.values():  # one trial = one configuration, all its seeds
            parts = []
            for m in members:
                sigma = m.get("privacy.accounted_noise_multiplier", m.get("privacy.noise_multiplier"))
                q, steps = m.get("privacy.sample_rate"), m.get("privacy.steps")
                if not (finite(sigma) and sigma > 0 and finite(q) and 0 < q <= 1 and is_number(steps)):
                    parts = None
                    break
                parts.append(gaussian_rdp(float(sigma), float(q), int(steps)))
            if parts is None:
                curves = None
                break
            curves.append([sum(v) for v in zip(*parts)])
        if curves and cost["run_delta"] > 0:
            worst = [max(v) for v in zip(*curves)]
            stopping = random_stopping_cost(worst, len(groups), cost["run_delta"])
            cost.update({"random_stopping": stopping,
                         "random_stopping_name": (f"K ~ truncated negative binomial (η = {stopping['eta']:g}, "
                                                  f"γ = {stopping['gamma']:.4g}), "
                                                  f"E[K] = {stopping['mean_trials']:.3g}")})
        out[dataset] = cost
    return out


def selection_sentences(costs: dict[str, dict[str, Any]]) -> list[str]:
    """One sentence per dataset: "best of k at ε = … → the selection procedure is (ε', δ')-DP"."""
    lines = []
    for c in costs.values():
        text = (f"{c['dataset']}: best of {c['configs']} DP configurations ({c['runs']} runs) at ε ≤ "
                f"{c['run_epsilon']:.3g} (δ = {c['run_delta']:.3g}) → selecting one on the private data is "
                f"({c['epsilon']:.3g}, {c['delta']:.3g})-DP by composition")
        if "random_stopping" in c:
            rs = c["random_stopping"]
            text += (f"; with a random number of trials ({c['random_stopping_name']}; Papernot & Steinke 2022) "
                     f"it would be ({rs['epsilon']:.3g}, {rs['delta']:.3g})-DP")
        lines.append(text + ".")
    return lines


def mark_selection(records: list[dict[str, Any]], costs: dict[str, dict[str, Any]]) -> None:
    for r in records:
        c = costs.get(selection_group(r))
        if c is None or not finite(r.get("privacy.epsilon")):
            continue
        r["privacy.selection_configs"] = c["configs"]
        r["privacy.selection_epsilon"] = c["epsilon"]
        r["privacy.selection_delta"] = c["delta"]
        if "random_stopping" in c:
            r["privacy.selection_epsilon_random_stopping"] = c["random_stopping"]["epsilon"]
            r["privacy.selection_delta_random_stopping"] = c["random_stopping"]["delta"]
            r["privacy.selection_random_stopping"] = c["random_stopping_name"]


def leaderboard(results: list[RunResult], seeds_grouped: bool = False, sort: str | None = None,
                descending: bool = False, costs: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Records of the ``done`` runs (or seed groups), with Pareto marks and the selection's price (``costs``:
    ``selection_costs(results)`` when the caller has them already), optionally sorted."""
    done = [r for r in results if r.status == "done"]
    records = group_seeds(done) if seeds_grouped else [flat_row(r) for r in done]
    mark_pareto(records)
    mark_selection(records, selection_costs(done) if costs is None else costs)
    mark_identical(records)
    return sort_records(records, sort, descending) if sort else records


def write_leaderboard(records: list[dict[str, Any]], out: Path, store: ResultStore) -> None:
    """The CSV at ``out``, written as every output file is (``ResultStore.write_outputs``: never through a link,
    never over the store)."""
    handle = io.StringIO(newline="")
    write_csv(records, handle)
    store.write_outputs({out: handle.getvalue().encode()}, "--out")

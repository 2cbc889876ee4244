"""docs/benchmark.md from the benchmark's runs (configs/benchmark/fashionmnist/, bench/benchmark.sh).

    python bench/benchmark_page.py --export runs/benchmark-fashionmnist   # the CSVs and the exposure grid
    python bench/benchmark_page.py                                        # the page from the committed CSVs

    python bench/benchmark_page.py --export-audits RESULTS   # only the one-run audits, row by row
    python bench/benchmark_page.py --export-informed RESULTS [RESULTS ...]  # the informed-reconstruction rows
                                                               # (their own CSV; from one folder or several)
    python bench/benchmark_page.py --export-model-audits RESULTS  # the final-model column (bench/model_audit_column.py)

``--export`` reads the results folder through dpeval's leaderboard (one row per run, its settings and every
metric) into docs/results/benchmark-fashionmnist.csv, scores every membership run's per-example file with
``dpeval.exposure`` into docs/results/benchmark-fashionmnist-exposure.csv, and draws the most exposed training
images per defense (docs/results/benchmark-fashionmnist-exposed.png; it needs the runs' score files and the data),
and gathers the one-run audits (RESULTS/audits/<defense>-eps<ε>.json, ``dpeval audit --scope run --json``) into
docs/results/benchmark-fashionmnist-audit.csv. The cost column comes from bench/benchmark_epoch.py's CSV
(docs/results/benchmark-fashionmnist-epoch.csv: every row's recipe timed side by side) where it is there.
Without it, the page, its table and its figures are made from the committed CSVs alone, so anyone can regenerate
them. A row of the page is a defense at an ε: utility over every seed (mean ± SEM), the attacks of its seed-0 run
(online and offline LiRA come from the two points of the grid, which train the same victim), communication and
time. The reading compares each defense with DP-SGD at the same ε: utility by Welch's 95% interval, leakage by the
attacks' DeLong intervals (a difference is *resolved* only where the two intervals do not overlap). The page's
"In short" block counts the same comparisons over every row. ``--export-informed`` gathers the runs of
``bench/benchmark.sh RESULTS informed`` (``informed-recon`` on every private row, seed 0) into
docs/results/benchmark-fashionmnist-informed.csv; the page's informed-reconstruction section (success with its
Clopper–Pearson interval beside the bound of each row's mechanism, a reading per defense, a figure) is made from it.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from collections import defaultdict
from pathlib import Path

from scipy import stats

from dpeval.core.files import save_figure
from dpeval.core.verdicts import BoundCheck
from dpeval.doc_markers import write_into

ROOT = Path(__file__).resolve().parents[1]


def _bench_module(name: str):
    """Another script of bench/ (not a package) as a module."""
    import importlib.util
    import sys

    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / f"{name}.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


model_audit_column = _bench_module("model_audit_column")  # the final-model column's rows and section


class Files:
    """Where the exports, figures and page go (``--docs``: a docs folder, default the repository's)."""

    def __init__(self, docs: Path) -> None:
        self.csv = docs / "results/benchmark-fashionmnist.csv"
        self.exposure = docs / "results/benchmark-fashionmnist-exposure.csv"
        self.audit = docs / "results/benchmark-fashionmnist-audit.csv"
        self.grid = docs / "results/benchmark-fashionmnist-exposed.png"
        self.figures = docs / "results/benchmark-fashionmnist.svg"
        self.epoch = docs / "results/benchmark-fashionmnist-epoch.csv"  # bench/benchmark_epoch.py --out
        self.informed = docs / "results/benchmark-fashionmnist-informed.csv"  # --export-informed
        self.informed_figure = docs / "results/benchmark-fashionmnist-informed.svg"
        self.model_audit = docs / "results/benchmark-fashionmnist-model-audit.csv"  # --export-model-audits
        self.page = docs / "benchmark.md"


ORDER = ["none", "dpsgd", "rs", "random-freeze", "gep", "adaclip", "groupwise (all)", "groupwise (layer)"]
MIA = ("lira", "rmia", "loss")
ROW_NAMES = {"groupwise-all": "groupwise (all)", "groupwise-layer": "groupwise (layer)"}  # recipe file → row
FPRS = (0.001, 0.01)
TOP_K = 50


def label(row: dict) -> str:
    name = str(row.get("defense"))
    return f"groupwise ({row.get('defense.groups')})" if name == "groupwise" else name


def num(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def epsilon(row: dict) -> float:
    """The ε a row was calibrated for (the grid's value; the accounted one lands just under it), ∞ without DP."""
    target = num(row.get("privacy.target_epsilon"))
    return target if math.isfinite(target) else num(row.get("privacy.epsilon"))


def is_online(row: dict) -> bool:
    return str(row.get("attack.lira.online", "")).lower() == "true"


# -- export: the runs and their per-record exposure -------------------------------------------------------
def export(results: Path, files: Files) -> None:
    from dpeval.exposure import exposed, exposures, shrink
    from dpeval.leaderboard import leaderboard, write_leaderboard
    from dpeval.store import ResultStore

    store = ResultStore(results)
    records = leaderboard(store.results("done"))
    kept = [{k: v for k, v in r.items() if not k.startswith(("artefacts.", "data.tokens.", "data.synthetic."))}
            for r in records]
    write_leaderboard(kept, files.csv, store)
    print(f"wrote {files.csv} ({len(kept)} runs)")
    scored = [r for r in records if r.get("artefacts.lira.scores")]
    by_record: dict[tuple[str, float, str, bool], list] = {}
    for r in scored:
        for attack in ("lira", "rmia"):
            path = r.get(f"artefacts.{attack}.scores")
            if path and (results / path).is_file():  # artefact paths are relative to the results folder
                by_record[(label(r), epsilon(r), attack, is_online(r))] = exposures(results / path)
    rows = []
    for (name, eps, attack, online), recs in sorted(by_record.items(), key=lambda kv: str(kv[0])):
        reference = by_record.get(("none", math.inf, attack, online))
        row = {"defense": name, "privacy.epsilon": eps, "attack": attack, "online": online, "members": len(recs)}
        for fpr in FPRS:
            row[f"exposed_at_{fpr:g}"] = len(exposed(recs, fpr))
        if reference is not None:
            s = shrink(reference, recs, TOP_K, 0.01)
            row.update({f"none_top{TOP_K}_still_exposed_at_0.01": s.still_exposed,
                        f"none_top{TOP_K}_median_fpr": s.median_fpr, f"none_top{TOP_K}_not_comparable": s.missing})
        rows.append(row)
    columns = list(dict.fromkeys(c for r in rows for c in r))
    with files.exposure.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {files.exposure} ({len(rows)} games)")
    draw_grid(records, {k: v for k, v in by_record.items() if k[2] == "lira" and k[3]}, files.grid)
    export_audits(results / "audits", files.audit)


INFORMED = "leakage.informed-recon."
INFORMED_METRICS = ("success", "success_ci_low", "success_ci_high", "success_linear", "bound", "bound_rdp", "bound_dp",
                    "chance", "bound_check", "bound_p_value", "verdict", "empirical_mu", "accounted_mu", "norm_ratio",
                    "targets", "candidates")
INFORMED_COLUMNS = ["defense", "privacy.target_epsilon", "privacy.epsilon", "privacy.noise_multiplier",
                    "privacy.accounted_noise_multiplier", "privacy.sample_rate", "privacy.steps",
                    "utility.test_accuracy", "comm.density",
                    *(INFORMED + k for k in INFORMED_METRICS)]


def export_informed(folders: list[Path], out: Path) -> None:
    """The informed-reconstruction runs of the results ``folders`` (the finished ones that played
    ``informed-recon``; several folders when rows ran side by side, each sweep in its own), one row each, the
    columns of ``INFORMED_COLUMNS`` (the defense as the page names its row)."""
    from dpeval.leaderboard import leaderboard
    from dpeval.store import ResultStore

    records = [r for results in folders for r in leaderboard(ResultStore(results).results("done"))
               if r.get(INFORMED + "success") is not None]
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, INFORMED_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({**r, "defense": label(r)} for r in records)
    print(f"wrote {out} ({len(records)} runs)")


def informed_section(rows: list[dict]) -> str:
    """The table (one line per defense and ε, in the page's order), what is missing, and a reading per defense: how
    close the attack came to its row's bound, and whether the bound held (the binomial check at level 0.05)."""
    rows = sorted(rows, key=lambda r: (ORDER.index(r["defense"]) if r["defense"] in ORDER else 99, epsilon(r)))
    lines = ["| defense | ε | σ accounted | success [95% CP] | linear-score success | bound 1 − f(1/n) | "
             "RDP ReRo bound | ε-based bound | bound check (p) | empirical μ / accounted μ | ‖c‖·σ |",
             "|" + "---|" * 11]
    for r in rows:
        m = {k: num(r.get(INFORMED + k)) for k in ("success", "success_ci_low", "success_ci_high", "success_linear",
                                                    "bound", "bound_rdp", "bound_dp", "bound_p_value",
                                                    "empirical_mu", "accounted_mu", "norm_ratio")}
        sigma = num(r.get("privacy.accounted_noise_multiplier") or r["privacy.noise_multiplier"])  # GEP: σ/√2
        lines.append(f"| {r['defense']} | {epsilon(r):.3g} | {sigma:.3g} | "
                     f"{m['success']:.3f} [{m['success_ci_low']:.3f}, {m['success_ci_high']:.3f}] | "
                     f"{m['success_linear']:.3f} | {m['bound']:.3f} | {m['bound_rdp']:.3f} | {m['bound_dp']:.3f} | "
                     f"{r.get(INFORMED + 'bound_check')} ({m['bound_p_value']:.2g}) | "
                     f"{m['empirical_mu']:.2f} / {m['accounted_mu']:.2f} | {m['norm_ratio']:.2f} |")
    planned = [(name, eps) for name in ORDER[1:] for eps in EPSILONS]
    have = {(r["defense"], round(epsilon(r))) for r in rows}
    missing = [f"{name} ε = {eps:g}" for name, eps in planned if (name, round(eps)) not in have]
    text = "\n".join(lines)
    if missing:
        text = (f"**Partial**: {len(rows)} of the {len(planned)} private rows measured; not yet: "
                f"{', '.join(missing)} (`bench/benchmark.sh RESULTS informed` resumes).\n\n" + text)
    by_defense: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_defense[r["defense"]].append(r)
    readings = []
    for name, rs in by_defense.items():
        parts = []
        for r in rs:
            success, bound = num(r[INFORMED + "success"]), num(r[INFORMED + "bound"])
            within = (f", above it within sampling error (p = {num(r[INFORMED + 'bound_p_value']):.2g})"
                      if success > bound and r.get(INFORMED + "bound_check") == BoundCheck.PASS else "")
            parts.append(f"ε = {epsilon(r):.3g}: {success:.2f} of a bound {bound:.2f} ({success / bound:.0%}{within})")
        held = all(r.get(INFORMED + "bound_check") == BoundCheck.PASS for r in rs)
        above = sum(num(r[INFORMED + "success_ci_low"]) > num(r[INFORMED + "chance"]) for r in rs)
        readings.append(f"- **{name}**: {'; '.join(parts)}; success above chance (0.1) in {above} of {len(rs)} "
                        f"row(s); the bound {'held in every row' if held else 'FAILED in a row: a bug to chase'}.")
    return text + "\n\n" + "\n".join(readings)


def informed_figure(rows: list[dict], out: Path) -> None:
    """Success (with its interval) and the bound of each defense's rows against ε."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    by_defense: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_defense[r["defense"]].append(r)
    for i, (name, rs) in enumerate(sorted(by_defense.items(), key=lambda kv: ORDER.index(kv[0]) if kv[0] in ORDER
                                          else 99)):
        rs = sorted(rs, key=epsilon)
        eps = [epsilon(r) * (1 + 0.03 * (i - len(by_defense) / 2)) for r in rs]  # side by side at one ε
        success = [num(r[INFORMED + "success"]) for r in rs]
        low = [s - num(r[INFORMED + "success_ci_low"]) for s, r in zip(success, rs)]
        high = [num(r[INFORMED + "success_ci_high"]) - s for s, r in zip(success, rs)]
        line = ax.errorbar(eps, success, yerr=[low, high], fmt="o", capsize=3, label=name)
        ax.plot(eps, [num(r[INFORMED + "bound"]) for r in rs], "_", ms=14, color=line[0].get_color())
    ax.axhline(0.1, color="k", ls=":", lw=0.8, label="chance (1/n)")
    ax.set(xscale="log", xlabel="ε", ylabel="informed reconstruction success",
           title="success (dots, 95% CP) and the mechanism's bound (dashes)")
    ax.set_xticks(list(EPSILONS), [f"{e:g}" for e in EPSILONS])
    ax.minorticks_off()
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out)
    print(f"wrote {out}")


AUDIT_COLUMNS = ["defense", "privacy.target_epsilon", "privacy.epsilon", "audit.epsilon_lower_bound", "audit.verdict",
                 "audit.estimator", "audit.mu_lower_bound", "audit.counting_epsilon", "audit.fdp_epsilon",
                 "audit.fdp_mu", "audit.pair_epsilon", "audit.pair_mu", "audit.pair_valid",
                 "audit.guesses", "audit.correct", "audit.canaries", "utility.test_accuracy", "time.audit_s"]
# the estimators' bounds of ``audit.bounds`` as flat CSV columns (an audit from before they existed has only the
# counting bound, its headline)
ESTIMATOR_COLUMNS = {"counting": ("audit.counting_epsilon", None, None),
                     "f-dp": ("audit.fdp_epsilon", "audit.fdp_mu", None),
                     "gaussian-pair": ("audit.pair_epsilon", "audit.pair_mu", "audit.pair_valid")}


def audit_row(audit: dict) -> dict:
    """The CSV row of one audit JSON: its headline keys and every estimator's bound flattened."""
    row = {k: audit.get(k) for k in AUDIT_COLUMNS}
    bounds = audit.get("audit.bounds") or {"counting": {"epsilon_lower_bound": audit["audit.epsilon_lower_bound"],
                                                        "mu_lower_bound": None, "valid": True}}
    row["audit.estimator"] = audit.get("audit.estimator", "counting")
    for name, (eps_key, mu_key, valid_key) in ESTIMATOR_COLUMNS.items():
        if name in bounds:
            row[eps_key] = bounds[name]["epsilon_lower_bound"]
            if mu_key:
                row[mu_key] = bounds[name]["mu_lower_bound"]
            if valid_key:
                row[valid_key] = bounds[name]["valid"]
    return row


def export_audits(folder: Path, out: Path, merge: bool = False) -> None:
    """One CSV row per one-run audit (``<defense>-eps<ε>.json``: the ε the run was calibrated for is in the name;
    the JSON holds the accounted one). ``merge``: keep the rows of ``out`` that the folder does not re-measure
    (same defense and target ε), so audits re-run in parts update the CSV row by row."""
    import json

    rows = []
    for path in sorted(folder.glob("*-eps*.json")):
        audit = json.loads(path.read_text())
        rows.append({**audit_row(audit), "defense": label(audit),
                     "privacy.target_epsilon": float(path.stem.rsplit("-eps", 1)[1])})
    if not rows:
        return
    if merge and out.is_file():
        fresh = {(r["defense"], float(r["privacy.target_epsilon"])) for r in rows}
        kept = [r for r in read(out) if (r["defense"], float(r["privacy.target_epsilon"])) not in fresh]
        rows = sorted(kept + rows, key=lambda r: (str(r["defense"]), float(r["privacy.target_epsilon"])))
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, AUDIT_COLUMNS, restval="")
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out} ({len(rows)} audits)")


def draw_grid(records: list[dict], lira: dict, out: Path) -> None:
    """The 8 most exposed training images of each defense's online-LiRA game at the middle ε (and none's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import dpeval

    if not lira:
        return
    eps_values = sorted({k[1] for k in lira if math.isfinite(k[1])})
    middle = eps_values[len(eps_values) // 2] if eps_values else math.inf
    shown = [(name, eps) for name in ORDER for eps in (middle, math.inf) if (name, eps, "lira", True) in lira]
    config = next(r for r in records if r.get("artefacts.lira.scores"))
    task = dpeval.load_data({"data": {"name": config["dataset"], "max_train": int(num(config["data.max_train"])),
                                      "public_fraction": num(config["data.public_fraction"]),
                                      "normalize": config["data.normalize"]}})
    images = {int(i): x for i, x in zip(task.train.source_index, task.train.x)}
    fig, axes = plt.subplots(len(shown), 8, figsize=(8 * 1.1, len(shown) * 1.35), squeeze=False)
    for row, (name, eps) in enumerate(shown):
        for col, e in enumerate(lira[(name, eps, "lira", True)][:8]):
            ax = axes[row][col]
            ax.imshow(images[e.index].squeeze(0).numpy(), cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"#{e.index} FPR {e.fpr:.1g}", fontsize=6)
            if col == 0:
                ax.set_ylabel(name if name == "none" else f"{name}\nε = {eps:g}", fontsize=7)
    fig.suptitle("Most exposed training images (online LiRA): the FPR at which each is named", fontsize=9)
    fig.tight_layout()
    save_figure(fig, out, dpi=130)
    print(f"wrote {out}")


# -- the page ----------------------------------------------------------------------------------------------
def read(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def mean_sem(values: list[float]) -> tuple[float, float, int]:
    n = len(values)
    if n == 0:
        return math.nan, math.nan, 0
    return statistics.fmean(values), (statistics.stdev(values) / math.sqrt(n) if n > 1 else math.nan), n


def welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    (ma, sa, na), (mb, sb, nb) = mean_sem(a), mean_sem(b)
    if na < 2 or nb < 2:
        return ma - mb, math.nan, math.nan
    se2 = sa**2 + sb**2
    if se2 == 0:
        return ma - mb, ma - mb, ma - mb
    df = se2**2 / (sa**4 / (na - 1) + sb**4 / (nb - 1))
    half = stats.t.ppf(0.975, df) * math.sqrt(se2)
    return ma - mb, ma - mb - half, ma - mb + half


class Cell:
    """One defense at one ε: its runs by seed, its seed-0 attack runs (online and offline)."""

    def __init__(self, name: str, eps: float) -> None:
        self.name, self.eps = name, eps
        self.accuracy: dict[int, float] = {}
        self.epoch_s: list[float] = []  # its runs' own wall time per epoch
        self.epoch_cpu = math.nan       # CPU s per epoch of its recipe, side by side with the others (benchmark_epoch)
        self.online: dict | None = None
        self.offline: dict | None = None
        self.audit: dict | None = None  # the one-run audit of this defense at this ε

    def add(self, row: dict) -> None:
        self.accuracy[int(num(row["seed"]))] = num(row["utility.test_accuracy"])
        epochs = num(row.get("train.epochs"))
        if epochs > 0 and not row.get("leakage.lira.auc"):  # attack runs also time their shadows' training
            self.epoch_s.append(num(row["time.train_s"]) / epochs)
        if row.get("leakage.lira.auc"):
            if is_online(row):
                self.online = row
            else:
                self.offline = row

    def metric(self, key: str, online: bool = True) -> float:
        row = self.online if online else self.offline
        return num(row.get(key)) if row else math.nan


def cells(rows: list[dict]) -> dict[tuple[str, float], Cell]:
    out: dict[tuple[str, float], Cell] = {}
    for row in rows:
        key = (label(row), epsilon(row))
        out.setdefault(key, Cell(*key)).add(row)
    return dict(sorted(out.items(), key=lambda kv: (ORDER.index(kv[0][0]) if kv[0][0] in ORDER else 99,
                                                       kv[0][1])))


def attach_audits(all_cells: dict[tuple[str, float], Cell], audits: list[dict]) -> None:
    for row in audits:
        cell = all_cells.get((row["defense"], num(row["privacy.target_epsilon"])))
        if cell is not None:
            cell.audit = row


def attach_epoch_costs(all_cells: dict[tuple[str, float], Cell], costs: list[dict]) -> None:
    """The side-by-side CPU time per epoch of each recipe (a file per row: ``groupwise-all`` is ``groupwise (all)``),
    for every ε of its row."""
    for row in costs:
        name = ROW_NAMES.get(row["row"], row["row"])
        for cell in all_cells.values():
            if cell.name == name:
                cell.epoch_cpu = num(row["cpu_s_per_epoch"])


def epoch_seconds(cell: Cell) -> float:
    """Seconds per epoch: the side-by-side CPU measurement where there is one, else the runs' own wall time."""
    if math.isfinite(cell.epoch_cpu):
        return cell.epoch_cpu
    return statistics.fmean(cell.epoch_s) if cell.epoch_s else math.nan


def audit(cell: Cell) -> str:
    """The one-run audit's bounds — counting / f-DP / Gaussian pair (a refused pair in brackets) — and its verdict
    (the strongest valid bound against the run's accounted ε)."""
    if cell.audit is None:
        return "–"
    a = cell.audit
    if not a.get("audit.fdp_epsilon"):  # an audit from before the f-DP and pair analyses
        return f"{num(a['audit.epsilon_lower_bound']):.2f} {a['audit.verdict']}"
    pair = f"{num(a['audit.pair_epsilon']):.2f}"
    if str(a.get("audit.pair_valid")) not in ("True", "true", "1"):
        pair = f"({pair})"
    return f"{num(a['audit.counting_epsilon']):.2f} / {num(a['audit.fdp_epsilon']):.2f} / {pair} {a['audit.verdict']}"


def pct(x: float, digits: int = 1) -> str:
    return "–" if not math.isfinite(x) else f"{100 * x:.{digits}f}"


def auc(cell: Cell, attack: str, online: bool = True) -> str:
    value = cell.metric(f"leakage.{attack}.auc", online)
    if not math.isfinite(value):
        return "–"
    lo, hi = cell.metric(f"leakage.{attack}.auc_ci_low", online), cell.metric(f"leakage.{attack}.auc_ci_high", online)
    return f"{value:.3f} [{lo:.3f}, {hi:.3f}]"


def table(all_cells: dict[tuple[str, float], Cell]) -> str:
    lines = ["| defense | ε | test acc. % (n) | density | s / epoch | LiRA online AUC [95%] | LiRA TPR @ 0.1 % / 1 % "
             "FPR | LiRA offline AUC | RMIA AUC | LOSS AUC | ε lower bound (best) / 2ε | "
             "one-run audit ε_LB: counting / f-DP / Gaussian pair | "
             "grad-MIA AUC | IG PSNR init / mid / final (data-free) |", "|" + "---|" * 14]
    for c in all_cells.values():
        m, s, n = mean_sem(list(c.accuracy.values()))
        bounds = [c.metric(f"leakage.{a}.epsilon_lower_bound", o) for a in MIA for o in (True, False)]
        best = max((b for b in bounds if math.isfinite(b)), default=math.nan)
        lb = f"{best:.2f} / {2 * c.eps:g}" if math.isfinite(best) else "–"
        psnr = " / ".join(f"{c.metric(f'leakage.ig.{st}.psnr'):.1f}" for st in sorted(ig_states(c), key=state_order))
        base = c.metric("leakage.ig.baseline_psnr")
        ig = f"{psnr} ({base:.1f})" if psnr else "–"
        tpr = " / ".join(pct(c.metric(f"leakage.lira.tpr_at_{p}pct_fpr"), 2) for p in ("0.1", "1"))
        density = f"{c.metric('comm.density'):.2f}" if c.online else "–"  # the attacked run's
        epoch = f"{epoch_seconds(c):.1f}" if math.isfinite(epoch_seconds(c)) else "–"
        lines.append(f"| {c.name} | {c.eps:g} | {pct(m)} ± {pct(s)} ({n}) | {density} | {epoch} | "
                     f"{auc(c, 'lira')} | {tpr} | {auc(c, 'lira', False)} | {auc(c, 'rmia')} | {auc(c, 'loss')} | "
                     f"{lb} | {audit(c)} | {auc(c, 'grad-mia')} | {ig} |")
    return "\n".join(lines)


def ig_states(c: Cell) -> list[str]:
    """The training states IG attacked in the seed-0 online run (``leakage.ig.<state>.psnr``)."""
    return [k.split(".")[2] for k in c.online if k.startswith("leakage.ig.") and k.endswith(".psnr")
            and k.count(".") == 3] if c.online else []


def state_order(state: str) -> float:
    return -1 if state == "init" else math.inf if state == "final" else num(state.split(":")[-1])


def resolved(lo: float, hi: float) -> bool:
    """An interval of a difference that excludes 0."""
    return math.isfinite(lo) and (lo > 0 or hi < 0)


def utility_difference(c: Cell, base: Cell) -> tuple[float, float, float]:
    """Test accuracy of ``c`` minus ``base``'s over seeds, with its 95 % Welch interval."""
    return welch(list(c.accuracy.values()), list(base.accuracy.values()))


def lira_apart(c: Cell, base: Cell) -> bool | None:
    """Whether the online-LiRA AUC intervals of ``c`` and ``base`` are disjoint; None where one is not measured."""
    if not (math.isfinite(c.metric("leakage.lira.auc")) and math.isfinite(base.metric("leakage.lira.auc"))):
        return None
    return (c.metric("leakage.lira.auc_ci_low") > base.metric("leakage.lira.auc_ci_high")
            or c.metric("leakage.lira.auc_ci_high") < base.metric("leakage.lira.auc_ci_low"))


def cost_ratio(c: Cell, base: Cell) -> float:
    """Training time per epoch of ``c`` over ``base``'s: the side-by-side measurement where both have one, else the
    runs' own wall times."""
    if math.isfinite(c.epoch_cpu) and math.isfinite(base.epoch_cpu):
        return c.epoch_cpu / base.epoch_cpu
    return statistics.fmean(c.epoch_s) / statistics.fmean(base.epoch_s) if c.epoch_s and base.epoch_s else math.nan


def against_dpsgd(all_cells: dict[tuple[str, float], Cell]) -> list[tuple[Cell, Cell]]:
    """Every defense row with DP-SGD's row at the same ε."""
    return [(c, all_cells[("dpsgd", eps)]) for (name, eps), c in all_cells.items()
            if name not in ("none", "dpsgd") and ("dpsgd", eps) in all_cells]


def readings(all_cells: dict[tuple[str, float], Cell]) -> str:
    lines = []
    for c, base in against_dpsgd(all_cells):
        d, lo, hi = utility_difference(c, base)
        util = (f"utility {100 * d:+.1f} points [{100 * lo:+.1f}, {100 * hi:+.1f}]" if math.isfinite(lo) else
                f"utility {100 * d:+.1f} points (too few seeds for an interval)")
        if math.isfinite(lo):
            util += " (resolved)" if resolved(lo, hi) else " (not resolved)"
        apart = lira_apart(c, base)
        leak = ("leakage not measured yet" if apart is None else
                f"online-LiRA AUC {c.metric('leakage.lira.auc'):.3f} vs {base.metric('leakage.lira.auc'):.3f} "
                f"({'resolved' if apart else 'intervals overlap: not resolved'})")
        density = c.metric("comm.density")
        costs = [f"density {density:.2f}"] if math.isfinite(density) else []
        ratio = cost_ratio(c, base)
        if math.isfinite(ratio):
            costs.append(f"{ratio:.1f}× DP-SGD's training time per epoch")
        lines.append(f"- **{c.name}, ε = {c.eps:g}** against DP-SGD: {util}; {leak}" + "".join(f"; {x}" for x in costs)
                     + ".")
    return "\n".join(lines) or "- (no defense has both its own and DP-SGD's runs at the same ε yet)"


def beats_guess(c: Cell) -> bool | None:
    """Whether Inverting Gradients beat its data-free guess at any attacked state; None where IG did not run."""
    psnrs = [c.metric(f"leakage.ig.{st}.psnr") for st in ig_states(c)]
    base = c.metric("leakage.ig.baseline_psnr")
    return any(p > base for p in psnrs) if psnrs and math.isfinite(base) else None


def summary(all_cells: dict[tuple[str, float], Cell], informed: list[dict] | None = None) -> str:
    """The table in a few sentences, counted from the cells: how far the defenses bring membership leakage down,
    what each resolves against DP-SGD at the same ε, whether reconstruction beat its guess (and, with the
    ``informed`` rows, how close the informed adversary came to its bound), the audits, the cost."""
    private = [c for (name, _), c in all_cells.items() if name != "none" and c.online]
    if not private:
        return "- (no private row attacked yet)"
    lines = []
    none = all_cells.get(("none", math.inf))
    aucs = [c.metric("leakage.lira.auc") for c in private]
    undefended = (f"without a defense online LiRA reaches AUC {auc(none, 'lira')}, "
                  f"{pct(none.metric('leakage.lira.tpr_at_0.1pct_fpr'), 2)} % TPR at 0.1 % FPR; "
                  if none is not None and none.online else "")
    lines.append(f"- **Membership**: {undefended}the {len(private)} private rows lie at AUC {min(aucs):.3f} to "
                 f"{max(aucs):.3f}.")
    pairs = against_dpsgd(all_cells)
    compared = {c: lira_apart(c, b) for c, b in pairs}
    apart = [f"{c.name} at ε = {c.eps:g}" for c, gap in compared.items() if gap]
    measured = sum(1 for gap in compared.values() if gap is not None)
    lines.append(f"- **Leakage against DP-SGD** at the same ε: {len(apart)} of {measured} defense rows resolve a "
                 f"different online-LiRA AUC" + (f" ({', '.join(apart)})." if apart else
                                                  ": no defense's leakage is measurably different from DP-SGD's."))
    diffs = [(c, *utility_difference(c, b)) for c, b in pairs]
    diffs = [(c, d, lo, hi) for c, d, lo, hi in diffs if math.isfinite(lo)]
    better = [f"{c.name} at ε = {c.eps:g} ({100 * d:+.1f})" for c, d, lo, hi in diffs if resolved(lo, hi) and d > 0]
    worse = [f"{c.name} at ε = {c.eps:g} ({100 * d:+.1f})" for c, d, lo, hi in diffs if resolved(lo, hi) and d < 0]
    lines.append(f"- **Utility against DP-SGD** (points of test accuracy over seeds): {len(diffs)} rows; resolved "
                 f"better: {', '.join(better) or 'none'}; resolved worse: {', '.join(worse) or 'none'}; the rest "
                 f"within their intervals.")
    ig = [beats_guess(c) for c in private]
    none_ig = beats_guess(none) if none is not None else None
    lines.append(f"- **Reconstruction**: Inverting Gradients beats its data-free guess on "
                 f"{sum(1 for x in ig if x)} of {sum(1 for x in ig if x is not None)} private rows"
                 + ("" if none_ig is None else f" (on the undefended release: {'yes' if none_ig else 'no'})") + ".")
    if informed:
        held = sum(1 for r in informed if r.get(INFORMED + "bound_check") == BoundCheck.PASS)
        shares = [num(r[INFORMED + "success"]) / num(r[INFORMED + "bound"]) for r in informed]
        lines.append(f"- **Informed reconstruction** (the adversary knows every training image but the target, "
                     f"which it names among 10): its bound 1 − f(1/n) held on {held} of {len(informed)} private "
                     f"rows; success {min(shares):.0%}–{max(shares):.0%} of the bound.")
    audited = [c.audit for c in all_cells.values() if c.audit is not None]
    if audited:
        passed = sum(1 for a in audited if a["audit.verdict"] == BoundCheck.PASS)
        lines.append(f"- **Audits**: {passed} of {len(audited)} one-run audits PASS (ε lower bound ≤ accounted ε)."
                     + audit_reach(audited))
    ratios = {c.name: r for c, r in ((c, cost_ratio(c, b)) for c, b in pairs) if math.isfinite(r)}
    if ratios:
        top = max(ratios, key=ratios.get)
        rest = [r for name, r in ratios.items() if name != top]
        lines.append(f"- **Cost**: training per epoch {top} {ratios[top]:.1f}× DP-SGD"
                     + (f", every other defense {min(rest):.1f}–{max(rest):.1f}×." if rest else "."))
    return "\n".join(lines)


def exposure_table(path: Path) -> str:
    if not path.is_file():
        return "(no exposure export yet: `--export`)"
    rows = [r for r in read(path) if r["attack"] == "lira" and r["online"] == "True"]
    lines = [f"| defense | ε | members | named at 0.1 % FPR | named at 1 % FPR | of none's {TOP_K} most exposed: still "
             f"named at 1 % FPR | their median FPR |", "|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (ORDER.index(r["defense"]) if r["defense"] in ORDER else 99,
                                         num(r["privacy.epsilon"]))):
        still, med = r.get(f"none_top{TOP_K}_still_exposed_at_0.01", ""), num(r.get(f"none_top{TOP_K}_median_fpr"))
        lines.append(f"| {r['defense']} | {num(r['privacy.epsilon']):g} | {r['members']} | {r['exposed_at_0.001']} | "
                     f"{r['exposed_at_0.01']} | {still or '–'} | {'–' if not math.isfinite(med) else f'{med:.3g}'} |")
    return "\n".join(lines)


EPSILONS = (1.0, 3.0, 8.0)


def progress(all_cells: dict[tuple[str, float], Cell]) -> str:
    """How much of the planned benchmark the table holds: one line while it is incomplete, nothing once complete."""
    planned = [("none", math.inf)] + [(name, eps) for name in ORDER[1:] for eps in EPSILONS]
    attacked = sum(1 for key in planned if key in all_cells and all_cells[key].online is not None)
    seeded = sum(1 for key in planned if key in all_cells and len(all_cells[key].accuracy) >= 3)
    if attacked == seeded == len(planned):
        return ""
    return (f"**Partial**: {attacked} of the {len(planned)} planned rows attacked, {seeded} with utility at three "
            f"seeds; the runs go on (`bench/benchmark.sh` resumes) and rows appear as they finish.\n\n")


def audit_reach(audited: list[dict]) -> str:
    """How much of the accounted ε each one-run estimator proves, over the audits that have it (the Gaussian pair
    over those whose scores it could model), and the headline estimator's count."""
    def valid(a: dict) -> bool:
        return str(a.get("audit.pair_valid")) in ("True", "true", "1")

    parts = []
    for name, key, keep in (("counting", "audit.counting_epsilon", None), ("f-DP", "audit.fdp_epsilon", None),
                            ("Gaussian pair", "audit.pair_epsilon", valid)):
        shares = [num(a[key]) / num(a["privacy.epsilon"]) for a in audited
                  if a.get(key) not in (None, "") and (keep is None or keep(a))]
        if shares:
            where = f" (valid on {len(shares)} of {len(audited)})" if keep is not None else ""
            parts.append(f"{name} {min(shares):.0%}–{max(shares):.0%}{where}")
    return f" Share of the accounted ε proved: {', '.join(parts)}." if len(parts) > 1 else ""


def compute(rows: list[dict], audits: list[dict]) -> str:
    """What the page's runs cost: training and attacks (shadow models included) of every run, and every audit, in
    hours of one thread (each run's own clock: the runs shared the machine's cores)."""
    seconds = sum(num(r.get("time.train_s") or 0) + num(r.get("time.attack_s") or 0) for r in rows)
    seconds += sum(num(a.get("time.audit_s") or 0) for a in audits)
    # The runs were made in pieces across interrupted sessions, so no single clock spans them; the wall time of one
    # uninterrupted `WORKERS=2` run is the compute spread over its two lanes (the longest game, one GEP point's 16
    # shadows, is far shorter than that half, so the lanes stay full).
    return (f"Compute: {seconds / 3600:.1f} h of one thread for these {len(rows)} runs and {len(audits)} audits "
            f"(`time.train_s` + `time.attack_s`, `time.audit_s`; one thread each, two sharing the 2 cores): "
            f"≈ {seconds / 7200:.1f} h of wall time on these 2 cores with `WORKERS=2`.")


def figures(all_cells: dict[tuple[str, float], Cell], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_defense: dict[str, list[Cell]] = defaultdict(list)
    for c in all_cells.values():
        by_defense[c.name].append(c)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for name, cs in by_defense.items():
        finite = [c for c in cs if math.isfinite(c.eps)]
        acc = [mean_sem(list(c.accuracy.values()))[0] for c in cs]
        aucs = [c.metric("leakage.lira.auc") for c in cs]
        if finite:
            axes[0].plot([c.eps for c in finite], [mean_sem(list(c.accuracy.values()))[0] for c in finite], "o-",
                         label=name)
            axes[1].plot([c.eps for c in finite], [c.metric("leakage.lira.auc") for c in finite], "o-", label=name)
        else:  # none: a horizontal line
            axes[0].axhline(acc[0], color="k", ls="--", lw=0.8, label=name)
            axes[1].axhline(aucs[0], color="k", ls="--", lw=0.8, label=name)
        axes[2].scatter(aucs, acc, label=name)
    axes[0].set(xscale="log", xlabel="ε", ylabel="test accuracy", title="utility vs ε")
    axes[1].set(xscale="log", xlabel="ε", ylabel="online LiRA AUC", title="leakage vs ε")
    axes[2].set(xlabel="online LiRA AUC", ylabel="test accuracy", title="utility vs leakage (up-left is better)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--export", type=Path, metavar="RESULTS", help="write the CSVs and the grid from this folder")
    parser.add_argument("--export-informed", type=Path, nargs="+", metavar="RESULTS",
                        help="write the informed-reconstruction CSV from these folders")
    parser.add_argument("--export-audits", type=Path, metavar="RESULTS",
                        help="update the audits' CSV from RESULTS/audits only, row by row (re-measured rows replace "
                             "their old ones)")
    parser.add_argument("--export-model-audits", type=Path, metavar="RESULTS",
                        help="write the final-model column's CSV from bench/model_audit_column.py's RESULTS folder")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="the docs folder (default: the repository's)")
    args = parser.parse_args()
    files = Files(args.docs)
    files.csv.parent.mkdir(parents=True, exist_ok=True)
    if args.export:
        export(args.export, files)
    if args.export_informed:
        export_informed(args.export_informed, files.informed)
    if args.export_audits:
        export_audits(args.export_audits / "audits", files.audit, merge=True)
    if args.export_model_audits:
        model_audit_column.export_rows(args.export_model_audits, files.model_audit)
    rows = [r for r in read(files.csv) if r.get("status", "done") == "done"]
    audits = read(files.audit) if files.audit.is_file() else []
    all_cells = cells(rows)
    attach_audits(all_cells, audits)
    epoch_note = ("s / epoch: the runs' own wall time (they shared the cores, so rows measured under other loads "
                  "differ by load)")
    if files.epoch.is_file():
        costs = read(files.epoch)
        attach_epoch_costs(all_cells, costs)
        epoch_note = (f"s / epoch: CPU seconds per training epoch of each row's recipe, every row measured side by "
                      f"side in one process (`bench/benchmark_epoch.py`, {costs[0]['threads']} thread, ε = "
                      f"{num(costs[0]['epsilon']):g}; `{files.epoch.relative_to(files.page.parent)}`), since the "
                      f"runs' own wall times were taken under different loads")
    figures(all_cells, files.figures)
    figure = f"\n\n![utility and leakage vs ε](results/{files.figures.name})"
    write_into(files.page, "benchmark-table",
               progress(all_cells) + table(all_cells) + "\n\n" + epoch_note + ". " + compute(rows, audits) + figure)
    write_into(files.page, "benchmark-readings", readings(all_cells))
    informed = read(files.informed) if files.informed.is_file() else []
    model_audits = read(files.model_audit) if files.model_audit.is_file() else []
    write_into(files.page, "benchmark-summary", summary(all_cells, informed)
               + ("\n" + model_audit_column.summary_line(model_audits) if model_audits else ""))
    if model_audits:
        write_into(files.page, "benchmark-model-audit", model_audit_column.section(model_audits))
    grid = f"\n\n![the most exposed training images](results/{files.grid.name})" if files.grid.is_file() else ""
    write_into(files.page, "benchmark-exposure", exposure_table(files.exposure) + grid)
    if informed:
        informed_figure(informed, files.informed_figure)
        write_into(files.page, "benchmark-informed", informed_section(informed) +
                   f"\n\n![informed reconstruction success and its bound](results/{files.informed_figure.name})")
    print(f"wrote {files.page}")


if __name__ == "__main__":
    main()

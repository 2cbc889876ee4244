"""The report's files: artefacts resolved inside their own run's folder and read by their conventions (ROC JSON,
reconstruction NPZ), the figures it writes (PNG + SVG), and which existing files an earlier report wrote."""

from __future__ import annotations

import itertools
import json
import re
import zipfile
import zlib
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from dpeval.core.errors import brief
from dpeval.core.files import plain_name, save_figure
from dpeval.report.labels import CELL_IMAGES
from dpeval.report.markup import PAGE_START

# What reading a damaged artefact raises: unreadable, not JSON / NPZ, pickled, truncated, wrong fields.
ARTEFACT_ERRORS = (OSError, ValueError, KeyError, IndexError, TypeError, EOFError, zipfile.BadZipFile, zlib.error)


def resolve_artefact(value: Any, root: Path, run_id: str) -> Path | None:
    """The file an artefact value names, relative to the results folder ``root`` (an absolute path of an
    older run: its part from ``<run_id>/`` on, under ``root/runs/``); None when it does not exist or
    leads outside ``root/runs/<run_id>/``."""
    if not isinstance(value, str) or not value or not plain_name(run_id):
        return None
    path = Path(value)
    if path.is_absolute():
        if run_id not in path.parts:
            return None
        path = Path("runs", *path.parts[path.parts.index(run_id):])
    run_dir = (root / "runs" / run_id).resolve()
    candidate = (root / path).resolve()
    return candidate if candidate.is_relative_to(run_dir) and candidate.is_file() else None


def damaged_line(run_id: str, key: str, path: Path, exc: BaseException) -> str:
    return f"run {run_id}: {key} = {path}: cannot be read ({type(exc).__name__}: {brief(str(exc), 120)})"


PNG_START = b"\x89PNG\r\n\x1a\n"


def earlier_output(path: Path) -> bool:
    """Whether the existing file ``path`` is one ``dpeval report`` writes, which a new report may replace: a page
    (by how it starts) or a figure (PNG or SVG drawn by Matplotlib, as all of report's are). The store behind a
    link, or a file of someone else's that has a figure's name, is not."""
    if path.is_symlink() or not path.is_file():
        return False
    with path.open("rb") as handle:
        head = handle.read(4096)
    if path.suffix in (".html", ".htm"):
        return head.startswith(PAGE_START.encode())
    drawn = {".png": head.startswith(PNG_START), ".svg": b"<svg" in head}
    return drawn.get(path.suffix, False) and b"Matplotlib" in head


def save_drawing(fig: plt.Figure, out_dir: Path, stem: str, name: str) -> Path:
    """PNG (embedded in the page) and SVG (vector, text kept as text) beside the HTML; returns the PNG. ``name``
    holds names from the store (an attack's, a setting's): the file name keeps their letters, digits, - and _
    only (never a / or ..), numbered where two names come out the same."""
    base = f"{stem}_{re.sub(r'[^A-Za-z0-9_-]+', '_', name)}"
    path = out_dir / f"{base}.png"
    for n in itertools.count(2):
        if not path.exists():
            break
        path = out_dir / f"{base}_{n}.png"
    try:
        # The tight frame is measured once for both files (``bbox_inches="tight"`` lays the figure out once more per
        # file, as long again as drawing it), with savefig's own padding.
        frame = fig.get_tightbbox().padded(matplotlib.rcParams["savefig.pad_inches"])
        save_figure(fig, path, dpi=110, bbox_inches=frame)
        with matplotlib.rc_context({"svg.fonttype": "none"}):
            save_figure(fig, path.with_suffix(".svg"), bbox_inches=frame)
    finally:
        plt.close(fig)
    return path


def read_roc(path: Path) -> tuple[list[float], list[float], float | None]:
    """(fpr, tpr, fpr_floor) of a ROC file; ValueError / KeyError / TypeError when it is not one."""
    data = json.loads(path.read_text())
    fpr, tpr = [float(v) for v in data["fpr"]], [float(v) for v in data["tpr"]]
    if len(fpr) != len(tpr) or not fpr:
        raise ValueError(f"{len(fpr)} false and {len(tpr)} true positive rates")
    floor = data.get("fpr_floor")
    return fpr, tpr, float(floor) if floor else None


def grid_cell(originals: np.ndarray, recon: np.ndarray) -> np.ndarray:
    """Originals (top) over reconstructions (bottom), side by side with 1-pixel white gaps: H x W x C."""
    def strip(images: np.ndarray) -> np.ndarray:
        c, h, _ = images.shape[1:]
        gap = np.full((c, h, 1), 255, np.uint8)
        parts = [p for img in images for p in (img, gap)][:-1]
        return np.concatenate(parts, axis=2)

    top, bottom = strip(originals), strip(recon)
    gap = np.full((top.shape[0], 1, top.shape[2]), 255, np.uint8)
    return np.transpose(np.concatenate([top, gap, bottom], axis=1), (1, 2, 0))


def read_cell(path: Path, state: Any) -> tuple[np.ndarray, np.ndarray, float, str]:
    """(originals, reconstructions at ``state`` or the best one, mean PSNR, state) of an images NPZ, never
    unpickling (``allow_pickle=False``); ARTEFACT_ERRORS when the file is not such an NPZ."""
    with np.load(path, allow_pickle=False) as data:
        states = [str(s) for s in data["states"]]
        k = states.index(state) if state in states else int(np.argmax(data["psnr"].mean(axis=(1, 2))))
        flat = data["originals"].reshape(-1, *data["originals"].shape[2:])[:CELL_IMAGES]
        recon = data["reconstructions"][k].reshape(-1, *flat.shape[1:])[:CELL_IMAGES]
        return flat, recon, float(data["psnr"][k].mean()), states[k]

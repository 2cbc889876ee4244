"""``dpeval report``: one self-contained HTML page (images embedded) with the figures and the table a paper
needs, every figure also written beside the HTML as PNG and as vector SVG (``<stem>_<figure>.png|svg``;
text stays text, so labels can be edited or searched).

Sections: a generated summary (what leaks under which attack, which accuracy differences exceed their SEM, the
test-set resolution, identical results, recipe differences); the seed-grouped leaderboard (every varying setting,
accuracy, each attack's headline, verdict and worst state, Pareto marks; settings common to every run in one line
above it); the standard DP figures — accuracy and leakage vs the requested ε with the non-private runs as reference
lines, configurations at matched ε, learning curves (test accuracy, training loss), communication density over
training — each when the runs make it meaningful; utility vs leakage per attack (every point labelled with its
swept value, filled = leaks / hollow = no leak detected, the data-free baseline or chance level as a line, the
Pareto front through the marked points only); leakage over the training trajectory per attack (per-state headline
against the attacked states); accuracy and leakage vs each swept numeric setting; ROC curves (log-log) of
membership attacks; reconstructions as one compact grid per attack (swept value × seed, originals over the worst
state's reconstructions); every metric each attack reported, one table per attack (``tables.metric_tables``: read
from the keys, so an attack's new metric shows without an edit here); and the pictures a run names that cannot be
found. A figure that would tell more than ``labels.MAX_DRAWN`` configurations apart is listed under "Figures not
drawn" instead. Everything read from the store is text on the page: the page builder (``markup``) is the one place
that writes HTML, and escapes it. The page and the figures are written only where ``ResultStore.write_outputs``
allows (``page.write_report``).

Artefact paths in results are relative to the results folder (``dpeval.attacking.artefact_path``), so a
moved or copied folder still reports its pictures; absolute paths of older runs are read under the
folder's own ``runs/<run_id>/``. An artefact resolves only inside its own run's folder (after following
links): a path that leads elsewhere (``../``, an absolute path, a symlink out) is never read. A file that
cannot be read as its convention says (damaged JSON, a truncated or pickled NPZ) is left out of its figure
and listed in one line under "Damaged artefacts". Artefact conventions read here:
``artefacts.<attack>.roc`` → JSON with ``fpr`` / ``tpr``; ``artefacts.<attack>.images`` → NPZ with
``originals`` [T, B, C, H, W], ``reconstructions`` [S, T, B, C, H, W] (uint8), ``states`` and ``psnr``;
any other ``artefacts.<attack>.*`` ending in ``.png`` is a picture (shown when a run has no NPZ).

The package is split by what it produces: ``markup`` (the HTML builder), ``labels`` (names, labels, colours,
limits), ``files`` (artefact resolution and reading, the figures' files), ``tables`` (the leaderboard and the
generated summary), ``figures`` (drawn from the leaderboard), ``artefact_figures`` (drawn from the runs'
artefacts), ``leaking_records`` (the exposure section) and ``page`` (the page in order). The report reads
the store's rows and artefacts only: the training images of the exposure grids are handed in by the caller
(``write_report``'s ``training_images``; ``dpeval.training_images`` loads them for ``dpeval report``).
"""

import matplotlib

matplotlib.use("Agg")  # headless: no display needed; before any module of the report imports pyplot

from dpeval.report.files import earlier_output  # noqa: E402
from dpeval.report.page import write_report  # noqa: E402

__all__ = ["earlier_output", "write_report"]

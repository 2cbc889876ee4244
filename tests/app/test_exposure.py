"""Per-record exposure from a scores file: the records flagged at an FPR are the ROC's TPR at that FPR (computed
independently by scikit-learn), ties count against the defender, and a defense's effect on the undefended model's
most exposed records is looked up by source index."""

import numpy as np
import pytest
from sklearn.metrics import roc_curve

from dpeval.exposure import exposed, exposures, shrink


def write_scores(path, members, nonmembers, target=-1, first_index=0):
    lines = ["target,split,index,label,member,score"]
    for i, s in enumerate(members):
        lines.append(f"{target},train,{first_index + i},{i % 10},1,{float(s)!r}")
    for i, s in enumerate(nonmembers):
        lines.append(f"{target},test,{i},{i % 10},0,{float(s)!r}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_records_flagged_at_an_fpr_are_the_rocs_tpr_there(tmp_path, seed):
    rng = np.random.default_rng(seed)
    members, nonmembers = rng.normal(0.5, 1, 3000), rng.normal(0, 1, 2000)
    members[:5] = 50.0  # a few records no non-member comes near
    records = exposures(write_scores(tmp_path / "scores.csv", members, nonmembers))
    assert len(records) == 3000 and [r.fpr for r in records] == sorted(r.fpr for r in records)
    assert {r.index for r in records[:5]} == set(range(5)) and records[0].fpr == 0.0
    labels = np.r_[np.ones(3000), np.zeros(2000)]
    fpr, tpr, _ = roc_curve(labels, np.r_[members, nonmembers])
    for target in (0.001, 0.01, 0.1, 0.5):
        assert len(exposed(records, target)) / 3000 == pytest.approx(float(tpr[fpr <= target].max()))


def test_ties_count_as_false_alarms(tmp_path):
    records = exposures(write_scores(tmp_path / "s.csv", [1.0, 2.0], [1.0, 0.0, 0.0, 0.0]))
    assert [(r.score, r.fpr) for r in records] == [(2.0, 0.0), (1.0, 0.25)]


def test_shrink_follows_the_same_records_into_the_defended_run(tmp_path):
    undefended = exposures(write_scores(tmp_path / "none.csv", [9, 8, 7, 0.5, 0.1], [1, 0, 0, 0]))
    defended = exposures(write_scores(tmp_path / "dp.csv", [0.5, 9, 0.2, 0.5, 0.1], [1, 0, 0, 0]))
    s = shrink(undefended, defended, k=3, fpr=0.0)
    # none's top 3 are indices 0, 1, 2; under the defense index 1 is still ahead of every non-member
    assert (s.k, s.still_exposed, s.missing) == (3, 1, 0)
    assert s.median_fpr == pytest.approx(0.25)
    other_pool = exposures(write_scores(tmp_path / "other.csv", [9, 8], [0, 0], first_index=100))
    assert shrink(undefended, other_pool, k=3).missing == 3


def test_a_file_that_is_not_a_scores_file_or_has_no_game_is_refused(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a scores file"):
        exposures(tmp_path / "x.csv")
    with pytest.raises(ValueError, match="non-members"):
        exposures(write_scores(tmp_path / "m.csv", [1.0], []))


@pytest.mark.timeout(30)
def test_a_fifo_is_refused_not_waited_on(tmp_path):
    """``dpeval.exposure.exposures`` on a FIFO used to wait for a writer forever."""
    import os

    os.mkfifo(tmp_path / "scores.csv")
    with pytest.raises(OSError, match="not a regular file"):
        exposures(tmp_path / "scores.csv")


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from dpeval import exposure

    path = write_scores(tmp_path / "scores.csv", [1.0, 2.0], [0.5, 1.5])
    assert len(exposures(path)) == 2  # the control: within the limit it is read
    monkeypatch.setattr(exposure, "MAX_SCORES_BYTES", path.stat().st_size - 1, raising=False)
    with pytest.raises(OSError, match=f"{path.stat().st_size} bytes"):
        exposures(path)

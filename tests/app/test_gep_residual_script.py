"""bench/gep_residual.py: the GEP residual's share and signal-to-noise, read from a stored GEP run."""

from __future__ import annotations

import math

import pytest

from tests.helpers import load_bench_script

gep_residual = load_bench_script("gep_residual")


@pytest.mark.parametrize("biased", [False, True])
def test_residual_share_of_a_stored_gep_run(tmp_path, biased):
    from click.testing import CliRunner

    from dpeval.cli import main

    result = CliRunner().invoke(main, ["run", "--defense", "gep", "--epochs", "1", "--set",
                                       f"defense.biased={str(biased).lower()}", "--set", "train.batch_size=128",
                                       "--set", "defense.clip0=1.0", "--set", "defense.clip1=0.2",
                                       "--results", str(tmp_path), "--quiet"])
    assert result.exit_code == 0, result.output
    (run,) = (tmp_path / "runs").iterdir()
    m = gep_residual.measure(run, batches=3)
    assert m["biased"] is biased and set(m["states"]) == {"init", "final"}
    for s in m["states"].values():
        assert 0 < s["projection_error"] <= 1  # V has orthonormal columns: the residual is the orthogonal rest
        assert s["embedding_signal"] <= 1.0 + 1e-6 and s["residual_signal"] <= 0.2 + 1e-6  # clipped means
        assert s["residual_noise"] == pytest.approx(m["sigma"] * 0.2 * math.sqrt(m["d"]) / 128)
        assert s["embedding_noise"] == pytest.approx(
            (m["sigma"] / math.sqrt(2) if biased else m["sigma"]) * 1.0 * math.sqrt(m["k"]) / 128)

"""Figures written through ``save_figure`` are reproducible, so a regenerated committed figure diffs empty."""
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from dpeval.core.files import save_figure  # noqa: E402


def draw(path):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1, 2], [1, 0, 2], marker="o", label="a")
    ax.legend()
    save_figure(fig, path)
    plt.close(fig)
    return path.read_bytes()


@pytest.mark.parametrize("suffix", [".svg", ".pdf", ".png"])
def test_the_same_figure_is_the_same_bytes(tmp_path, suffix):
    first = draw(tmp_path / f"a{suffix}")
    assert draw(tmp_path / f"b{suffix}") == first


def test_svg_carries_no_date_and_fixed_ids(tmp_path):
    import matplotlib.pyplot as plt

    text = draw(tmp_path / "a.svg").decode()
    assert "<dc:date>" not in text
    # plain savefig (a random salt, today's date) differs between two draws: the control
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0], marker="o")
    fig.savefig(tmp_path / "c.svg")
    fig.savefig(tmp_path / "d.svg")
    plt.close(fig)
    assert (tmp_path / "c.svg").read_bytes() != (tmp_path / "d.svg").read_bytes()

"""hvdk8s.common.figures: every report figure is written beside its path and renamed onto it, then closed."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from hvdk8s.benchmarks.reporting import report
from hvdk8s.common import figures

from conftest import REPO

pytestmark = pytest.mark.unit

PNG = b"\x89PNG\r\n\x1a\n"


def replaced(path: Path, write) -> bytes:
    """Run ``write`` over an existing ``path`` held open by a reader; return what the reader then reads.

    An atomic write renames a new file onto the path, so the reader keeps the old one whole; a write in
    place truncates the reader's file under it."""
    path.write_bytes(b"previous")
    with path.open("rb") as reader:
        write()
        return reader.read()


def test_a_figure_is_saved_whole_or_not_at_all(tmp_path):
    plt = figures.pyplot()
    path = tmp_path / "plot.png"
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    assert replaced(path, lambda: figures.save_figure(fig, path)) == b"previous"
    good = path.read_bytes()
    assert good[:8] == PNG and plt.get_fignums() == []
    fig, ax = plt.subplots()
    ax.set_title(r"$\frac{$")  # mathtext that fails when the figure is drawn
    with pytest.raises(ValueError):
        figures.save_figure(fig, path)
    assert path.read_bytes() == good and [p.name for p in tmp_path.iterdir()] == ["plot.png"]  # no temporary left
    assert plt.get_fignums() == []  # closed either way


def test_benchmark_plots_are_saved_atomically(tmp_path):
    path = tmp_path / "tta.png"
    runs = [{"round": 0, "workers": 2, "strategy": "hvdk8s", "result": {"time_to_accuracy": {
        "target": 0.9, "curve": [{"train_seconds": 1.0, "test_accuracy": 0.5}, {"train_seconds": 2.0, "test_accuracy": 0.95}]}}}]
    assert replaced(path, lambda: report.plot_tta(runs, path)) == b"previous"
    assert path.read_bytes()[:8] == PNG


def test_every_figure_is_saved_through_save_figure():
    """No module saves a figure itself (each would be one more non-atomic writer)."""
    sources = [p for folder in ("hvdk8s", "pipeline", "serving", "benchmarks", "launcher", "mpijob", "cluster",
                                "examples") for p in (REPO / folder).rglob("*.py")]
    assert len(sources) > 50
    assert [str(p.relative_to(REPO)) for p in sources if re.search(r"\.savefig\(", p.read_text())] == [
        "hvdk8s/common/figures.py"]

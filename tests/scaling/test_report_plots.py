"""gpt/scaling/report.py's plots draw with the fonts every matplotlib has: their log axes are
labelled in plain text, not mathtext, whose STIX and Computer Modern fonts a font cache built by
another matplotlib may lack (`tinygpt scaling` printed ~21 `findfont:` lines so; found by a
review). Run: pytest tests/scaling/test_report_plots.py"""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("matplotlib")

from gpt.scaling import report  # noqa: E402
from gpt.tracking.plots import log_scale, pyplot, save  # noqa: E402


def test_log_axes_need_no_font_but_dejavu_sans(tmp_path, monkeypatch, caplog):
    from matplotlib import font_manager

    only_dejavu = [f for f in font_manager.fontManager.ttflist if f.name == "DejaVu Sans"]
    assert only_dejavu, "matplotlib ships DejaVu Sans"
    monkeypatch.setattr(font_manager.fontManager, "ttflist", only_dejavu)  # as a cache without mathtext's fonts
    font_manager.fontManager._findfont_cached.cache_clear()
    fig = pyplot().figure(figsize=(7, 5))
    ax = fig.add_subplot(1, 1, 1)
    ax.plot([1e10, 3e10, 9e10, 3.6e11], [9e3, 2e4, 5e4, 1e5], "o", label="optima")
    log_scale(ax, "y")  # as the frontier's
    report._finish(ax, "compute C (training FLOPs)", "N_opt", "a title")
    with caplog.at_level(logging.WARNING, logger="matplotlib.font_manager"):
        fig.canvas.draw()
        labels = [t.get_text() for t in ax.get_xticklabels() + ax.get_yticklabels() if t.get_text()]
        save(fig, tmp_path / "plot.png")
    font_manager.fontManager._findfont_cached.cache_clear()
    assert "findfont" not in caplog.text, caplog.text
    assert labels and not any("$" in label for label in labels), labels
    assert (tmp_path / "plot.png").stat().st_size > 0

"""The PNG attention renderer: what each figure draws, read back from the matplotlib objects."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("matplotlib", reason="the PNG renderer needs the `plot` extra (matplotlib)")

from attnserve.clients import columns, plot  # noqa: E402
from attnserve.api.generation import AttentionMatrix, WordTiming  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

TEXT = AttentionMatrix([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]], ["儲存", "檔案"], ["Save", "file", "</s>"], 1, "layer 1")
SPANS = [f"{i * 0.04:.2f}-{(i + 1) * 0.04:.2f}" for i in range(10)]
WORDS = [WordTiming("the", 0.0, 0.12), WordTiming("cat", 0.12, 0.4)]
AUDIO = AttentionMatrix([[0.3] * 3 + [0.1] * 7, [0.0] * 3 + [0.2] * 5 + [0.0] * 2], ["the", "cat"], SPANS, 0, "l0")


def test_text_heatmap_labels_both_axes_and_shades_every_weight():
    figure = plot.attention_figure(TEXT)
    axes = figure.axes[0]
    assert [t.get_text() for t in axes.get_xticklabels()] == TEXT.col_labels
    assert [t.get_text() for t in axes.get_yticklabels()] == TEXT.row_labels
    assert (axes.get_xlabel(), axes.get_ylabel()) == ("source", "output")
    np.testing.assert_array_equal(axes.images[0].get_array(), TEXT.weights)
    assert len(figure.axes) == 2  # the heatmap and its colour bar


def test_timeline_puts_columns_on_seconds_and_outlines_each_words_span():
    figure = plot.timeline_figure(WORDS, AUDIO)
    heat, strip = figure.axes[:2]
    assert heat.images[0].get_extent()[:2] == [0.0, pytest.approx(0.4)]
    outlines = [p for p in heat.patches if isinstance(p, Rectangle)]
    assert [(r.get_x(), r.get_x() + r.get_width()) for r in outlines] == [(0.0, 0.12), (0.12, pytest.approx(0.4))]
    assert [t.get_text() for t in heat.get_yticklabels()] == ["the", "cat"]
    assert [t.get_text() for t in strip.texts] == ["the", "cat"] and strip.get_xlabel() == "time (s)"


def test_timeline_refuses_what_is_not_an_audio_response():
    with pytest.raises(ValueError, match="not time spans"):
        plot.timeline_figure(WORDS, TEXT)
    with pytest.raises(ValueError, match="2 attention rows for 1 words"):
        plot.timeline_figure(WORDS[:1], AUDIO)


def test_saved_files_are_pngs_of_the_figure(tmp_path):
    from matplotlib import image

    plot.save_attention(TEXT, str(tmp_path / "text.png"))
    plot.save_timeline(WORDS, AUDIO, str(tmp_path / "audio.png"))
    for name in ("text.png", "audio.png"):
        pixels = image.imread(tmp_path / name)
        assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
        assert pixels[..., :3].std() > 0.05  # something is drawn


def test_column_labels_are_read_as_spans_or_cells():
    assert columns.time_spans(["0.00-0.04", "0.04-0.08"]) == [columns.TimeSpan(0.0, 0.04), columns.TimeSpan(0.04, 0.08)]
    assert columns.grid_cells(["r1c2:64,32,96,64"]) == [columns.GridCell(1, 2, (64, 32, 96, 64))]
    assert columns.time_spans(["Save", "</s>"]) is None and columns.grid_cells(["0.00-0.04"]) is None
    assert columns.time_spans([]) is None

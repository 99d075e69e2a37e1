"""Attention figures: a panel per head, every token written, the PNG of the size the figure asks for."""

import io

import numpy as np
import pytest
from matplotlib.image import imread

from tf_transformer.attention_views.figures import DPI, LINE_FLOOR, head_grid, png_bytes, token_lines, two_heads

TOKENS = ["\u2581The", "\u2581law", "\u2581will", "\u2581never", "\u2581be", "\u2581perfect", ".", "</s>"]


def weights(heads: int, queries: int, keys: int, seed: int = 0) -> np.ndarray:
    values = np.random.default_rng(seed).random([heads, queries, keys]) ** 4  # peaked rows
    return values / values.sum(axis=-1, keepdims=True)


def image_size(figure) -> tuple[int, int]:
    """``(height, width)`` in pixels the figure asks for, and check its PNG has them."""
    width, height = (figure.get_size_inches() * DPI).round().astype(int)
    pixels = imread(io.BytesIO(png_bytes(figure)))
    assert pixels.shape[:2] == (height, width)
    return height, width


def heatmaps(figure):
    return [axis for axis in figure.axes if axis.images]


@pytest.mark.parametrize("heads, rows", [(8, 2), (4, 1), (1, 1), (6, 2)])
def test_head_grid_draws_a_panel_per_head(heads, rows):
    figure = head_grid(weights(heads, 5, len(TOKENS)), TOKENS[:5], TOKENS, "layer 1")
    panels = heatmaps(figure)
    assert len(panels) == heads
    assert [axis.get_title() for axis in panels] == [f"head {head}" for head in range(heads)]
    for axis in panels:
        assert [label.get_text() for label in axis.get_xticklabels()] == TOKENS
        assert [label.get_text() for label in axis.get_yticklabels()] == TOKENS[:5]
        np.testing.assert_allclose(axis.images[0].get_array().sum(axis=1), 1.0, atol=1e-6)
    assert len({round(axis.get_position().y0, 3) for axis in panels}) == rows
    height, width = image_size(figure)
    assert width >= 4 * 250 if heads >= 4 else width >= heads * 250  # 2.5 inches a panel at least


def test_head_grid_grows_with_the_sentence():
    short = image_size(head_grid(weights(4, 4, 4), TOKENS[:4], TOKENS[:4], "short"))
    long = image_size(head_grid(weights(4, 40, 40), TOKENS * 5, TOKENS * 5, "long"))
    assert long[0] > short[0] and long[1] > short[1]  # room for every label at the same font size


def test_token_lines_draw_one_colour_per_head_and_weights_as_opacity():
    attention = weights(4, len(TOKENS), len(TOKENS), seed=3)
    figure = token_lines(attention, TOKENS, TOKENS, query=3, title="'never'")
    axis = figure.axes[0]
    expected = int((attention[:, 3] >= LINE_FLOOR).sum())  # a line for each head's key above the floor
    assert len(axis.lines) == expected
    colors = {line.get_color() for line in axis.lines}
    assert len(colors) == len({head for head in range(4) if (attention[head, 3] >= LINE_FLOOR).any()})
    assert sorted(line.get_alpha() for line in axis.lines) == pytest.approx(
        sorted(attention[:, 3][attention[:, 3] >= LINE_FLOOR])
    )
    assert [text.get_text() for text in axis.texts] == TOKENS + TOKENS
    assert [text.get_text() for text in axis.get_legend().get_texts()] == [f"head {h}" for h in range(4)]
    image_size(figure)


def test_two_heads_draws_both_heads_then_the_token_in_both():
    attention = weights(8, len(TOKENS), len(TOKENS), seed=4)
    figure = two_heads(attention, TOKENS, TOKENS, heads=(5, 6), query=2, title="layer 5")
    assert len(figure.axes) == 3
    full = [int((attention[head] >= LINE_FLOOR).sum()) for head in (5, 6)]
    assert [len(axis.lines) for axis in figure.axes] == [*full, int((attention[[5, 6], 2] >= LINE_FLOOR).sum())]
    assert "head 5" in figure.axes[0].get_title() and "head 6" in figure.axes[1].get_title()
    image_size(figure)


def test_weights_that_do_not_match_the_tokens_are_refused():
    with pytest.raises(ValueError, match=r"expected \[heads, 3 queries, 8 keys\]"):
        head_grid(weights(2, 4, 8), TOKENS[:3], TOKENS, "wrong")

"""Figures of attention weights: heatmaps of every head, and the paper's line drawings (figures 3–5).

Pure matplotlib over numpy arrays (``[heads, queries, keys]``, rows summing to
1) and token labels, so training (TensorBoard images), ``tft-attention`` and
tests draw with the same code. Figures use the Agg backend: no display needed.

- :func:`head_grid`: one heatmap per head of a layer, queries down, keys across.
- :func:`token_lines`: figure 3's drawing. Tokens in two columns, the attending
  token on the left; a line to each token it attends to, one colour per head,
  as opaque as the weight.
- :func:`two_heads`: figures 4–5: the full attention of two heads side by
  side, and one token's attention in both.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")  # files and PNG bytes only; never a window

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

CELL_INCHES = 0.2  # one token on a heatmap's axis: room for a label at FONT_SIZE
FONT_SIZE = 7
DPI = 100
LINE_FLOOR = 0.05  # lines for weights below this are left out: they would only be grey noise


def _check(weights: np.ndarray, queries: Sequence[str], keys: Sequence[str]) -> np.ndarray:
    weights = np.asarray(weights, np.float32)
    if weights.ndim != 3 or weights.shape[1:] != (len(queries), len(keys)):
        raise ValueError(
            f"weights of shape {weights.shape}: expected [heads, {len(queries)} queries, {len(keys)} keys]"
        )
    return weights


def head_colors(count: int) -> list:
    """One colour per head: matplotlib's qualitative ``tab10`` (``tab20`` past 10 heads)."""
    cmap = plt.get_cmap("tab10" if count <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(count)]


def head_grid(
    weights: np.ndarray,
    queries: Sequence[str],
    keys: Sequence[str],
    title: str,
    columns: int = 4,
    panel_titles: Sequence[str] | None = None,
) -> Figure:
    """Heatmaps of ``weights [heads, queries, keys]``, one panel per head (``panel_titles``: default "head h").

    Queries label the rows, keys the columns, every token written; the panels share
    one colour scale from 0 to 1.
    """
    weights = _check(weights, queries, keys)
    heads = weights.shape[0]
    columns = max(1, min(columns, heads))
    rows = -(-heads // columns)
    panel_width = max(2.5, CELL_INCHES * len(keys) + 1.2)  # room for the query labels on the left
    panel_height = max(2.5, CELL_INCHES * len(queries) + 1.2)  # and the key labels below
    figure, axes = plt.subplots(
        rows,
        columns,
        figsize=(panel_width * columns + 0.8, panel_height * rows + 0.6),
        squeeze=False,
        dpi=DPI,
        layout="constrained",  # titles, labels and the colour bar placed without overlapping
    )
    image = None
    for axis in axes.flat[heads:]:  # the last row's empty places
        axis.remove()
    for head, axis in enumerate(axes.flat[:heads]):
        image = axis.imshow(weights[head], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        axis.set_title(panel_titles[head] if panel_titles else f"head {head}", fontsize=FONT_SIZE + 1)
        axis.set_xticks(range(len(keys)), keys, rotation=90, fontsize=FONT_SIZE)
        axis.set_yticks(range(len(queries)), queries, fontsize=FONT_SIZE)
        axis.tick_params(length=0)
    figure.suptitle(title, fontsize=FONT_SIZE + 3)
    figure.colorbar(image, ax=axes.ravel()[:heads].tolist(), shrink=0.6, label="attention weight")
    return figure


def _columns(axis, queries: Sequence[str], keys: Sequence[str], highlight: int | None = None) -> None:
    """Writes the attending tokens in a left column and the attended ones in a right column."""
    for row, token in enumerate(queries):
        axis.text(
            0.0,
            -row,
            token,
            ha="right",
            va="center",
            fontsize=FONT_SIZE + 1,
            weight="bold" if row == highlight else None,
        )
    for row, token in enumerate(keys):
        axis.text(1.0, -row, token, ha="left", va="center", fontsize=FONT_SIZE + 1)
    axis.set_xlim(-0.9, 1.9)
    axis.set_ylim(-max(len(queries), len(keys)), 1)
    axis.axis("off")


def _lines(axis, weights: np.ndarray, query: int | None, color, offset: float = 0.0) -> None:
    """Lines from attending tokens (all, or ``query``) to the tokens they attend to, alpha = weight."""
    rows = range(weights.shape[0]) if query is None else [query]
    for row in rows:
        for key in np.flatnonzero(weights[row] >= LINE_FLOOR):
            axis.plot(
                [0.05, 0.95],
                [-row + offset, -key + offset],
                color=color,
                alpha=float(min(1.0, weights[row, key])),
                linewidth=2.0,
                solid_capstyle="butt",
            )


def token_lines(
    weights: np.ndarray,
    queries: Sequence[str],
    keys: Sequence[str],
    query: int,
    title: str,
    heads: Sequence[int] | None = None,
) -> Figure:
    """Figure 3's drawing: what ``queries[query]`` attends to in each of ``heads`` (default: all), a colour each."""
    weights = _check(weights, queries, keys)
    heads = list(range(weights.shape[0])) if heads is None else list(heads)
    colors = head_colors(weights.shape[0])
    height = max(3.0, 0.22 * max(len(queries), len(keys)) + 1.0)
    figure, axis = plt.subplots(figsize=(6.0, height), dpi=DPI)
    _columns(axis, queries, keys, highlight=query)
    spread = 0.3 / max(len(heads), 1)  # each head's lines a little apart, as the paper's coloured bands
    for rank, head in enumerate(heads):
        _lines(axis, weights[head], query, colors[head], offset=(rank - (len(heads) - 1) / 2) * spread)
    axis.legend(
        handles=[plt.Line2D([], [], color=colors[head], linewidth=3) for head in heads],
        labels=[f"head {head}" for head in heads],
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=min(len(heads), 8),
        fontsize=FONT_SIZE,
        frameon=False,
    )
    axis.set_title(textwrap.fill(title, 70), fontsize=FONT_SIZE + 2)  # 70 characters fit the 6-inch width
    figure.tight_layout()
    return figure


def two_heads(
    weights: np.ndarray,
    queries: Sequence[str],
    keys: Sequence[str],
    heads: tuple[int, int],
    query: int,
    title: str,
) -> Figure:
    """Figures 4–5: the full attention of two heads (every token's lines), then ``queries[query]``'s in both."""
    weights = _check(weights, queries, keys)
    colors = head_colors(weights.shape[0])
    height = max(3.0, 0.22 * max(len(queries), len(keys)) + 1.0)
    figure, axes = plt.subplots(1, 3, figsize=(15.0, height), dpi=DPI)
    for axis, head in zip(axes[:2], heads, strict=True):
        _columns(axis, queries, keys)
        _lines(axis, weights[head], None, colors[head])
        axis.set_title(f"head {head}: every token", fontsize=FONT_SIZE + 2, color=colors[head])
    _columns(axes[2], queries, keys, highlight=query)
    for rank, head in enumerate(heads):
        _lines(axes[2], weights[head], query, colors[head], offset=(rank - 0.5) * 0.15)
    axes[2].set_title(f"'{queries[query]}' only: head {heads[0]} and head {heads[1]}", fontsize=FONT_SIZE + 2)
    figure.suptitle(title, fontsize=FONT_SIZE + 3)
    figure.tight_layout()
    return figure


def png_bytes(figure: Figure) -> bytes:
    """The figure as PNG bytes (TensorBoard images); the figure is closed."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    plt.close(figure)
    return buffer.getvalue()


def save_png(figure: Figure, path: str) -> None:
    """Writes the figure to ``path`` as a PNG and closes it."""
    figure.savefig(path, format="png", dpi=DPI)
    plt.close(figure)

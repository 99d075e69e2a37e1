"""A constituency tree drawn with matplotlib (docs/parsing.md's example; nltk's own drawing needs a display).

Leaves sit on one baseline in sentence order, each constituent centred over
its children one level up, as trees are drawn in the treebank literature.
Several trees (gold above, a parse below) share one figure with
:func:`tree_figure`.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only; never a window

from matplotlib.figure import Figure  # noqa: E402
from nltk import Tree  # noqa: E402

FONT_SIZE = 8
LEAF_INCHES = 0.75  # width per word
LEVEL_INCHES = 0.42  # height per tree level


def _layout(tree: Tree) -> tuple[list[tuple[float, float, str, bool]], list[tuple[float, float, float, float]]]:
    """``(x, level, label, is_word)`` of every node and the lines between them (words at x = 0, 1, …, all on the
    level below the deepest constituent)."""
    nodes, lines, leaf = [], [], 0

    def place(node, level: int) -> tuple[float, int | None]:
        nonlocal leaf
        if isinstance(node, str):
            x, leaf = float(leaf), leaf + 1
            nodes.append((x, None, node, True))
            return x, None
        children = [place(child, level + 1) for child in node]
        x = sum(child_x for child_x, _ in children) / len(children)
        nodes.append((x, level, node.label(), False))
        lines.extend((x, level, child_x, child_level) for child_x, child_level in children)
        return x, level

    place(tree, 0)
    words = max(level for _, level, _, _ in nodes if level is not None) + 1
    nodes = [(x, words if level is None else level, label, is_word) for x, level, label, is_word in nodes]
    lines = [(x0, l0, x1, words if l1 is None else l1) for x0, l0, x1, l1 in lines]
    return nodes, lines


def tree_figure(trees: list[Tree], titles: list[str]) -> Figure:
    """One panel per tree, top to bottom, each titled (e.g. ``["gold", "parse"]``)."""
    if len(trees) != len(titles):
        raise ValueError(f"{len(trees)} trees but {len(titles)} titles")
    layouts = [_layout(tree) for tree in trees]
    width = max(len(tree.leaves()) for tree in trees) * LEAF_INCHES + 0.5
    heights = [(max(depth for _, depth, _, _ in nodes) + 1) * LEVEL_INCHES + 0.4 for nodes, _ in layouts]
    figure = Figure(figsize=(width, sum(heights)))
    axes = figure.subplots(len(trees), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    for axis, (nodes, lines), title in zip(axes, layouts, titles, strict=True):
        for x0, d0, x1, d1 in lines:
            axis.plot([x0, x1], [-d0, -d1], color="0.6", linewidth=0.8, zorder=1)
        for x, depth, label, is_word in nodes:
            axis.text(
                x,
                -depth,
                label,
                ha="center",
                va="center",
                fontsize=FONT_SIZE,
                fontweight="normal" if is_word else "bold",
                color="black" if is_word else "#1f4e9c",
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5},
                zorder=2,
            )
        bottom = max(depth for _, depth, _, _ in nodes)
        axis.set_xlim(-0.6, max(x for x, _, _, _ in nodes) + 0.6)
        axis.set_ylim(-bottom - 0.5, 0.5)
        axis.set_title(title, fontsize=FONT_SIZE + 1, loc="left")
        axis.axis("off")
    figure.tight_layout()
    return figure

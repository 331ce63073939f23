"""One style for every figure of the benchmarks and the notebooks.

A family keeps its colour in every figure, a depth its marker; the colours are matplotlib's tab10
(told apart under the common colour-vision deficiencies together with the depth markers), one per
family and never two alike among the deep-GP families or among the BNN families:

* :data:`FAMILY_COLOURS`: the deep-GP families of :data:`deepgp_gi.families.DEEP_GP_FAMILIES` and
  the latent-variable variants of mean-field and global (``latent_mean_field``, ``latent_global``:
  ``latent_dim`` set), which have colours of their own;
* :data:`BNN_FAMILY_COLOURS`: the BNN families of :data:`deepgp_gi.families.BNN_FAMILIES`. A BNN
  family named like a deep-GP family (``global``, ``local``) has its colour, ``factorised`` (the
  weights' mean-field) mean-field's; the others reuse colours of deep-GP families, so a figure
  draws BNN and deep-GP families on separate axes, each with its own legend.

Settings of a family (a decaying learning rate, another minibatch, ``offdiagonal="plain"``) keep
the family's colour and differ by line style (:data:`VARIANT_LINESTYLES`) or by a text label beside
the point (:func:`place_labels`). References that are not ours (a paper's number, the true density,
HMC) are black or grey and dashed.

A row that is a mean over several splits is drawn filled with its standard-error bar; a row of one
split has no error bar to draw and is drawn hollow (:func:`errorbar_or_point`, and
:func:`split_handles` for the legend), so that it is not mistaken for a tight error bar.
"""

from __future__ import annotations

import math
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

#: matplotlib's tab10, by name.
TAB10 = {
    "blue": "#1f77b4",
    "orange": "#ff7f0e",
    "green": "#2ca02c",
    "red": "#d62728",
    "purple": "#9467bd",
    "brown": "#8c564b",
    "pink": "#e377c2",
    "grey": "#7f7f7f",
    "olive": "#bcbd22",
    "cyan": "#17becf",
}

#: Deep-GP family -> colour (the API's names; the latent-variable variants as ``latent_<family>``).
FAMILY_COLOURS: Dict[str, str] = {
    "mean_field": TAB10["blue"],
    "global": TAB10["orange"],
    "fully_coupled": TAB10["green"],
    "stripes_arrow": TAB10["red"],
    "local": TAB10["purple"],
    "sghmc": TAB10["brown"],
    "bsgp": TAB10["pink"],
    "dspp": TAB10["grey"],
    "latent_mean_field": TAB10["cyan"],
    "latent_global": TAB10["olive"],
}

#: BNN family -> colour (the API's names; ``global``, ``local`` and ``factorised`` as their deep-GP
#: counterparts ``global``, ``local`` and ``mean_field``).
BNN_FAMILY_COLOURS: Dict[str, str] = {
    "factorised": TAB10["blue"],
    "global": TAB10["orange"],
    "local": TAB10["purple"],
    "factorised_global": TAB10["green"],
    "random_global": TAB10["red"],
    "ffg_u": TAB10["cyan"],
    "ensemble_u": TAB10["olive"],
    "ensemble_w": TAB10["brown"],
}

#: What is not ours (a paper's number, the true log density, an HMC reference): black, dashed.
REFERENCE_COLOUR = "black"
#: The colour of a family this module does not know (none should be drawn in it).
UNKNOWN_COLOUR = "#444444"

#: Depth -> marker, in every figure.
DEPTH_MARKERS: Dict[int, str] = {1: "v", 2: "o", 3: "s", 4: "^", 5: "D", 6: "p"}

#: Line styles for the settings variants of one family (the first: the family's default).
VARIANT_LINESTYLES: Tuple = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))

#: Colour bar map for a value drawn as colour (a density, a weight).
SEQUENTIAL_CMAP = "viridis"

_LATENT = re.compile(r"\+w\d+K\d+|\(latent\b|^latent[ _]")


def base_family(label: str) -> str:
    """The family a row's label names: ``"global+decay0.8"`` -> ``"global"``,
    ``"global+w1K5"`` and ``"global (latent 1, K=5)"`` -> ``"latent_global"``,
    ``"stripes_arrow (plain)"`` -> ``"stripes_arrow"``, ``"bnn factorised_global (neal)"`` ->
    ``"factorised_global"``."""
    text = label.strip()
    if text.lower().startswith("bnn "):
        text = text[4:]
    latent = bool(_LATENT.search(text))
    name = re.split(r"[ +(,]", re.sub(r"^latent[ _]", "", text), maxsplit=1)[0]
    name = name.replace("-", "_")
    if latent and not name.startswith("latent_"):
        name = "latent_" + name
    return name


def family_colour(label: str, model: str = "gp") -> str:
    """The colour of the family that ``label`` names (:func:`base_family`); ``model="bnn"`` (or a
    label starting ``"bnn "``) looks it up among the BNN families."""
    if label.lower().startswith("bnn "):
        model = "bnn"
    table = BNN_FAMILY_COLOURS if model == "bnn" else FAMILY_COLOURS
    return table.get(base_family(label), UNKNOWN_COLOUR)


def family_name(family: str) -> str:
    """A family as a legend names it: ``latent_global`` -> ``latent global``."""
    return family.replace("latent_", "latent ", 1)


def family_order(families: Iterable[str], model: str = "gp") -> List[str]:
    """``families`` (base names) in this module's order, unknown ones last."""
    table = list(BNN_FAMILY_COLOURS if model == "bnn" else FAMILY_COLOURS)
    return sorted(set(families), key=lambda f: (table.index(f) if f in table else len(table), f))


def depth_marker(depth: Optional[int]) -> str:
    """The marker of a depth ("X" for one outside :data:`DEPTH_MARKERS`)."""
    return DEPTH_MARKERS.get(depth, "X")


def variant_linestyle(index: int):
    """The line style of a family's ``index``-th settings variant (0: the default, solid)."""
    return VARIANT_LINESTYLES[index % len(VARIANT_LINESTYLES)]


def errorbar_or_point(
    ax,
    x: float,
    y: float,
    se: Optional[float],
    n_splits: int,
    color,
    marker: str = "o",
    horizontal: bool = False,
    markersize: float = 7,
    **kwargs,
):
    """Draw one row: a filled marker with its standard-error bar when it is a mean over several
    splits (and a finite SE), a hollow marker without bar when it is one split. ``horizontal``:
    the bar is along x (``x`` is the value, ``y`` the row). Returns the artist."""
    multi = n_splits > 1 and se is not None and math.isfinite(se)
    if multi:
        err = {"xerr" if horizontal else "yerr": se}
        return ax.errorbar(
            x,
            y,
            fmt=marker,
            color=color,
            markersize=markersize,
            capsize=3,
            elinewidth=1.2,
            **err,
            **kwargs,
        )
    kwargs.setdefault("markeredgewidth", 1.6)
    (line,) = ax.plot(
        [x], [y], marker, color=color, mfc="white", mec=color, markersize=markersize, **kwargs
    )
    return line


def _handle(**kwargs):
    from matplotlib.lines import Line2D

    kwargs.setdefault("ls", "")
    kwargs.setdefault("color", "k")
    return Line2D([], [], **kwargs)


def family_handles(families: Iterable[str], model: str = "gp", labels: Optional[Dict] = None):
    """Legend entries: one coloured square per family (``labels``: family -> text)."""
    labels = labels or {}
    return [
        _handle(
            marker="s",
            color=family_colour(f, model),
            markersize=8,
            label=labels.get(f, family_name(f)),
        )
        for f in families
    ]


def depth_handles(depths: Iterable[int]):
    """Legend entries: one black marker per depth."""
    return [
        _handle(marker=depth_marker(d), mfc="0.35", mec="k", markersize=7, label=f"depth {d}")
        for d in sorted(set(depths))
    ]


def split_handles(multi: bool = True, single: bool = True):
    """Legend entries for how a row is drawn: "mean ± SE over splits" (filled, with a bar) and
    "1 split" (hollow)."""
    out = []
    if multi:
        out.append(_handle(marker="o", mfc="0.35", mec="k", label="mean ± SE over splits"))
    if single:
        out.append(_handle(marker="o", mfc="white", mec="k", markeredgewidth=1.6, label="1 split"))
    return out


def heading_handle(text: str):
    """A legend line with no symbol: a heading between groups of entries."""
    return _handle(marker="", label=text)


def legend_outside(ax, handles=None, labels=None, where: str = "right", title=None, **kwargs):
    """A legend beside the axes (``where="right"``) or under them (``"below"``), off the data.
    ``ax`` may be a figure (the legend under or beside all its axes; call before
    ``tight_layout`` / ``savefig(bbox_inches="tight")``). Returns the legend (``None`` when there
    is nothing to list)."""
    kwargs.setdefault("fontsize", 8)
    kwargs.setdefault("frameon", False)
    if handles is None:
        handles, labels = [], []
        for a in getattr(ax, "axes", [ax]) if not hasattr(ax, "transAxes") else [ax]:
            h, lab = a.get_legend_handles_labels()
            handles, labels = handles + h, labels + lab
        seen = {}
        for h, lab in zip(handles, labels):  # one entry per label
            seen.setdefault(lab, h)
        handles, labels = list(seen.values()), list(seen)
    if not handles:  # nothing drawn with a label: no legend
        return None
    if labels is not None:
        kwargs["labels"] = labels
    if where == "below":
        kwargs.setdefault("ncol", min(4, max(1, len(handles))))
        if hasattr(ax, "transAxes"):  # about 40 points under the axes, below the x label
            height = ax.get_position().height * ax.figure.get_figheight() * 72
            place = dict(loc="upper center", bbox_to_anchor=(0.5, -40.0 / max(height, 1.0)))
        else:  # a figure
            place = dict(loc="upper center", bbox_to_anchor=(0.5, 0.0))
    else:
        place = dict(loc="center left", bbox_to_anchor=(1.01, 0.5))
        if not hasattr(ax, "transAxes"):
            place = dict(loc="center left", bbox_to_anchor=(1.0, 0.5))
    return ax.legend(handles=handles, title=title, **place, **kwargs)


def place_labels(
    ax,
    points: Sequence[Tuple[float, float, str]],
    fontsize: float = 7,
    color="0.15",
    avoid: Sequence[Tuple[float, float]] = (),
) -> List:
    """Write each ``(x, y, text)`` beside its point without two labels overlapping (nor covering
    a point of ``points`` or ``avoid``): each label takes the first of a ring of offsets around its
    point where it fits, farther ones as the near ones fill. Call after the axes' limits are final.
    Returns the text artists."""
    fig = ax.figure
    ax.set_xlim(ax.get_xlim())  # the leader lines below must not move the limits
    ax.set_ylim(ax.get_ylim())
    fig.canvas.draw()  # a renderer for the text extents
    renderer = fig.canvas.get_renderer()
    to_px = ax.transData.transform
    dots = [to_px((x, y)) for x, y, _ in points] + [to_px(p) for p in avoid]
    taken: List[Tuple[float, float, float, float]] = [
        (px - 6, py - 6, px + 6, py + 6) for px, py in dots
    ]
    offsets = [
        (r * dx, r * dy)
        for r in (5, 10, 16, 24, 34, 46)
        for dx, dy in ((1, 0), (1, 1), (1, -1), (-1, 0), (0, 1.3), (0, -1.3), (-1, 1), (-1, -1))
    ]
    texts = []
    for x, y, text in points:
        px, py = to_px((x, y))
        for dx, dy in offsets:
            ha = "left" if dx > 0 else "right" if dx < 0 else "center"
            va = "bottom" if dy > 0 else "top" if dy < 0 else "center"
            artist = ax.annotate(
                text,
                (x, y),
                xytext=(dx, dy),
                textcoords="offset points",
                ha=ha,
                va=va,
                fontsize=fontsize,
                color=color,
            )
            box = artist.get_window_extent(renderer)
            rect = (box.x0, box.y0, box.x1, box.y1)
            inside = ax.get_window_extent(renderer)
            fits = inside.x0 <= rect[0] and rect[2] <= inside.x1 and inside.y0 <= rect[1]
            fits = fits and rect[3] <= inside.y1
            if fits and not any(_overlap(rect, t) for t in taken):
                break
            artist.remove()
        else:  # nowhere free: the first place, drawn anyway
            dx, dy = offsets[0]
            artist = ax.annotate(
                text,
                (x, y),
                xytext=(dx, dy),
                textcoords="offset points",
                va="center",
                fontsize=fontsize,
                color=color,
            )
            box = artist.get_window_extent(renderer)
            rect = (box.x0, box.y0, box.x1, box.y1)
        if abs(dx) > 5 or abs(dy) > 7:  # a leader line to a label moved away from its point
            k = 0.8 * fig.dpi / 72  # points to pixels
            end = ax.transData.inverted().transform((px + dx * k, py + dy * k))
            ax.plot([x, end[0]], [y, end[1]], color="0.6", lw=0.5, zorder=1)
        taken.append(rect)
        texts.append(artist)
    return texts


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]

"""benchmarks/plot_style.py: a colour for every family of the API, no two alike, and the labels of
the benchmark rows mapped to their families."""

import itertools

import matplotlib
import pytest

from benchmarks import plot_style
from deepgp_gi.families import BNN_FAMILIES, CONV_BNN_FAMILIES, DEEP_GP_FAMILIES


def _distance(a, b) -> float:
    ra, rb = matplotlib.colors.to_rgb(a), matplotlib.colors.to_rgb(b)
    return sum((x - y) ** 2 for x, y in zip(ra, rb)) ** 0.5


def test_every_family_has_a_colour():
    assert set(DEEP_GP_FAMILIES) <= set(plot_style.FAMILY_COLOURS)
    assert {"latent_mean_field", "latent_global"} <= set(plot_style.FAMILY_COLOURS)
    assert set(BNN_FAMILIES) | set(CONV_BNN_FAMILIES) <= set(plot_style.BNN_FAMILY_COLOURS)


@pytest.mark.parametrize("table", [plot_style.FAMILY_COLOURS, plot_style.BNN_FAMILY_COLOURS])
def test_no_two_families_alike(table):
    for (f, a), (g, b) in itertools.combinations(table.items(), 2):
        assert _distance(a, b) > 0.25, (f, g)
    for f, colour in table.items():  # none is the references' black
        assert _distance(colour, plot_style.REFERENCE_COLOUR) > 0.25, f


@pytest.mark.parametrize(
    "label, family",
    [
        ("global+decay0.8", "global"),
        ("global+w1K5", "latent_global"),
        ("mean_field+w1K5", "latent_mean_field"),
        ("global (latent 1, K=5)", "latent_global"),
        ("stripes_arrow (plain)", "stripes_arrow"),
        ("sghmc+M128", "sghmc"),
        ("bnn factorised_global (neal, W_L sampled)", "factorised_global"),
        ("ffg_u M=100", "ffg_u"),
    ],
)
def test_base_family(label, family):
    assert plot_style.base_family(label) == family


def test_one_split_is_hollow_and_several_have_a_bar():
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    bar = plot_style.errorbar_or_point(ax, 1.0, 2.0, 0.1, 3, "C0")
    point = plot_style.errorbar_or_point(ax, 1.0, 2.0, float("nan"), 1, "C0")
    assert isinstance(bar, matplotlib.container.ErrorbarContainer)
    assert point.get_markerfacecolor() == "white" and not hasattr(point, "lines")
    plt.close(fig)

"""gpt/scaling/fit.py: IsoFLOP fits recover the exponents of a known loss law from noisy losses,
and budgets that cannot be fitted are left out with their reason.
Run: pytest tests/scaling/test_fit.py"""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpt.errors import TinyGPTError
from gpt.scaling.fit import Point, fit, isoflop_optimum

# Chinchilla's fitted law (Hoffmann et al. 2022, approach 3): L = E + A / N^alpha + B / D^beta.
# Along C = 6 N D its optimum is N_opt ~ C^(beta / (alpha + beta)), D_opt ~ C^(alpha / (alpha + beta)).
ALPHA, BETA, A, B = 0.34, 0.28, 406.4, 410.7


def law(n, d, e=1.69):
    return e + A / n**ALPHA + B / d**BETA


def n_opt(c):
    """The true optimum of `law` at budget c (minimising over N with D = c / 6N)."""
    g = (ALPHA * A / (BETA * B)) ** (1 / (ALPHA + BETA))
    return g * (c / 6) ** (BETA / (ALPHA + BETA))


def study(budgets, sizes, noise: float, seed: int = 0, e=1.69) -> list[Point]:
    rng = np.random.default_rng(seed)
    points = []
    for c in budgets:
        for i, n in enumerate(sizes(c)):
            d = c / (6 * n)
            points.append(Point(c, i + 1, int(n), int(d), c, float(law(n, d, e) + rng.normal(0, noise))))
    return points


BUDGETS = [1e18, 3e18, 1e19, 3e19, 1e20]


@pytest.mark.parametrize("seed", range(5))
def test_planted_exponents_are_recovered_within_5_percent(seed):
    # One ladder for every budget, as a study trains: 9 sizes, 30x apart end to end, wide enough
    # to hold every budget's optimum; loss noise of 0.005 nats, about what an eval of 40k tokens has.
    ladder = np.geomspace(n_opt(BUDGETS[0]) / 6, n_opt(BUDGETS[-1]) * 6, 9)
    result = fit(study(BUDGETS, lambda c: ladder, noise=0.005, seed=seed), predict=1e21)
    a, b = BETA / (ALPHA + BETA), ALPHA / (ALPHA + BETA)
    assert abs(result["a"] - a) / a < 0.05 and abs(result["b"] - b) / b < 0.05, (result["a"], result["b"])
    assert all(o["inside"] for o in result["optima"]) and not result["skipped"]
    assert abs(math.log(result["prediction"]["params"] / n_opt(1e21))) < math.log(1.25)


def test_the_loss_law_is_recovered_without_an_irreducible_term():
    """With E = 0 the optimal loss is itself a power law: L_opt ~ C^(-alpha beta / (alpha + beta))."""
    result = fit(study(BUDGETS, lambda c: n_opt(c) * np.geomspace(1 / 4, 4, 7), noise=0.0, e=0.0), predict=1e21)
    c = -ALPHA * BETA / (ALPHA + BETA)
    assert abs(result["loss_exponent"] - c) / abs(c) < 0.05
    optimum = min(law(n, 1e21 / (6 * n), e=0.0) for n in np.geomspace(1e8, 1e12, 4000))
    assert abs(result["prediction"]["loss"] - optimum) / optimum < 0.02


def test_budgets_that_cannot_be_fitted_are_left_out_with_their_reason():
    points = study(BUDGETS[:3], lambda c: n_opt(c) * np.geomspace(1 / 4, 4, 5), noise=0.0)
    two_sizes = [p for p in points if p.budget == BUDGETS[0]][:2]
    rest = [p for p in points if p.budget != BUDGETS[0]]
    result = fit(two_sizes + rest, predict=1e20)
    assert [o["budget"] for o in result["optima"]] == BUDGETS[1:3]
    assert "2 finished size(s); a parabola needs 3" in result["skipped"]["1e+18"]
    # losses that fall with size all along the ladder: no minimum to fit
    falling = [Point(1e18, i, n, 1, 1e18, 3.0 - 0.1 * i**2) for i, n in enumerate((10, 100, 1000))]
    with pytest.raises(TinyGPTError, match="no minimum"):
        isoflop_optimum(falling)
    with pytest.raises(TinyGPTError, match="too few budgets to fit power laws"):
        fit(two_sizes + [p for p in points if p.budget == BUDGETS[1]], predict=1e20)


def test_a_vertex_beyond_the_ladder_is_flagged():
    points = study([1e18], lambda c: n_opt(c) * np.geomspace(2, 8, 4), noise=0.0)
    assert not isoflop_optimum(points).inside
    assert isoflop_optimum(study([1e18], lambda c: n_opt(c) * np.geomspace(1 / 4, 4, 5), noise=0.0)).inside


def test_an_extrapolated_vertex_is_left_out_of_the_laws_while_two_inside_remain():
    centred = lambda c: n_opt(c) * np.geomspace(1 / 4, 4, 5)  # noqa: E731
    beyond = study([1e18], lambda c: n_opt(c) * np.geomspace(3, 12, 4), noise=0.0)  # its vertex: below the ladder
    result = fit(beyond + study([1e19, 1e20], centred, noise=0.0), predict=1e21)
    assert [o["in_fit"] for o in result["optima"]] == [False, True, True]
    assert abs(result["a"] - BETA / (ALPHA + BETA)) < 0.02 and result["all_vertices"]["a"] != result["a"]
    # with fewer than two vertices inside, every vertex is used
    result = fit(beyond + study([1e19], centred, noise=0.0), predict=1e21)
    assert [o["in_fit"] for o in result["optima"]] == [True, True] and result["all_vertices"]["a"] == result["a"]

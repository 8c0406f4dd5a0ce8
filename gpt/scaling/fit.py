"""The fits of an IsoFLOP study (Chinchilla's approach 2), in plain NumPy.

For each compute budget C, the final loss of models of several sizes N trained on C FLOPs:

    L(ln N) = p2 (ln N)^2 + p1 ln N + p0      a parabola in log size; its vertex is the budget's
    N_opt = exp(-p1 / (2 p2)), L_opt = L(ln N_opt)        optimal size and the loss it reaches
    D_opt: the tokens the budget buys at N_opt (ln D is linear in ln N along one budget: D = C /
           C_token(N), read off the budget's own runs, so the attention term is in it too)

then, over budgets, power laws fitted as straight lines in log-log:

    N_opt = k_N C^a      D_opt = k_D C^b      L_opt = k_L C^c

(C ~ 6 N D makes a + b close to 1.) A vertex outside the sizes trained is an extrapolation: it
is reported and flagged (`inside`), and left out of the power laws while 2 vertices inside
their ladders remain (see `fit`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from gpt.errors import TinyGPTError


@dataclass
class Point:
    """One finished run of a study."""

    budget: float  # the FLOPs it was given (train.flops_budget)
    depth: int
    params: int  # N: the weights that multiply (params_non_embedding)
    tokens: int  # D: tokens trained on
    flops: float  # what it spent (<= budget: whole steps only)
    loss: float  # final validation loss
    run: str = ""  # its folder


@dataclass
class Optimum:
    """The vertex of one budget's parabola."""

    budget: float
    params: float  # N_opt
    tokens: float  # D_opt
    loss: float  # L_opt
    inside: bool  # N_opt lies within the sizes trained at this budget
    coefficients: tuple[float, float, float]  # p2, p1, p0 of the parabola in ln N


@dataclass
class PowerLaw:
    """y = coefficient * C^exponent, fitted in log-log."""

    exponent: float
    coefficient: float

    def __call__(self, c: float) -> float:
        return self.coefficient * c**self.exponent


def isoflop_optimum(points: list[Point]) -> Optimum:
    """The parabola in ln N through one budget's runs (least squares) and its vertex."""
    if len({p.params for p in points}) < 3:
        raise TinyGPTError(f"budget {points[0].budget:g}: {len(points)} finished size(s); a parabola needs 3")
    x = np.log([p.params for p in points])
    p2, p1, p0 = np.polyfit(x, [p.loss for p in points], 2)
    if not p2 > 0:  # no minimum: the loss falls (or rises) with size all along the ladder
        best = min(points, key=lambda p: p.loss)
        raise TinyGPTError(
            f"budget {best.budget:g}: the losses over sizes curve downward (no minimum; best at depth {best.depth}); "
            f"the ladder is too narrow or too noisy for this budget"
        )
    x_opt = -p1 / (2 * p2)
    slope, intercept = np.polyfit(x, np.log([p.tokens for p in points]), 1)
    return Optimum(
        budget=points[0].budget,
        params=float(math.exp(x_opt)),
        tokens=float(math.exp(slope * x_opt + intercept)),
        loss=float(p0 - p1 * p1 / (4 * p2)),
        inside=bool(x.min() <= x_opt <= x.max()),
        coefficients=(float(p2), float(p1), float(p0)),
    )


def power_law(c: list[float], y: list[float]) -> PowerLaw:
    exponent, intercept = np.polyfit(np.log(c), np.log(y), 1)
    return PowerLaw(float(exponent), float(math.exp(intercept)))


def laws(optima: list[Optimum]) -> tuple[PowerLaw, PowerLaw, PowerLaw]:
    """N_opt, D_opt and L_opt as power laws of compute, through these optima."""
    c = [o.budget for o in optima]
    return tuple(power_law(c, [getattr(o, key) for o in optima]) for key in ("params", "tokens", "loss"))


def fit(points: list[Point], predict: float) -> dict:
    """The study's fit (what fit.json holds): per-budget optima, the exponents `a` (N_opt ~ C^a),
    `b` (D_opt ~ C^b) and `loss_exponent` (L_opt ~ C^c), and the prediction at budget `predict`.
    Budgets with fewer than 3 finished sizes, or no minimum, are left out and said why. The laws
    go through the vertices that lie inside their ladders when at least 2 do: a vertex beyond the
    sizes trained is the parabola's guess, not a measured optimum (`in_fit` says which were used;
    `all_vertices` has the laws through every vertex, for comparison)."""
    by_budget: dict[float, list[Point]] = {}
    for p in points:
        by_budget.setdefault(p.budget, []).append(p)
    optima, skipped = [], {}
    for budget in sorted(by_budget):
        try:
            optima.append(isoflop_optimum(by_budget[budget]))
        except TinyGPTError as e:
            skipped[f"{budget:g}"] = str(e)
    if len(optima) < 2:
        reasons = "; ".join(skipped.values()) or "no finished runs"
        raise TinyGPTError(f"too few budgets to fit power laws ({len(optima)} of {len(by_budget)} fitted: {reasons})")
    inside = [o for o in optima if o.inside]
    used = inside if len(inside) >= 2 else optima
    n_law, d_law, l_law = laws(used)
    every = laws(optima)
    return {
        "a": n_law.exponent,
        "b": d_law.exponent,
        "loss_exponent": l_law.exponent,
        "laws": {"params": asdict(n_law), "tokens": asdict(d_law), "loss": asdict(l_law)},
        "all_vertices": {"a": every[0].exponent, "b": every[1].exponent, "loss_exponent": every[2].exponent},
        "optima": [{**asdict(o), "coefficients": list(o.coefficients), "in_fit": o.inside or used is optima} for o in optima],
        "skipped": skipped,
        "prediction": {"budget": predict, "params": n_law(predict), "tokens": d_law(predict), "loss": l_law(predict)},
    }

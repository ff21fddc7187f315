"""Tables and figures of the planner and the simulator."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from spotrain.core.errors import CostInputError
from spotrain.cost.simulation import ON_DEMAND_ONLY, Summary

SLACKS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
"""Deadline slack swept by the figures: the deadline is the work x (1 + slack)."""


def _hours(value: float) -> str:
    return f"{value:.1f} h" if math.isfinite(value) else "never"


def table(summaries: Sequence[Summary], *, recommended: str | None = None) -> str:
    """One line per strategy; costs also as a share of on-demand only."""
    baseline = next((s.mean_cost for s in summaries if s.strategy == ON_DEMAND_ONLY), None)
    lines = [
        f"{'strategy':<18} {'cost':>11} {'vs OD':>6} {'finish':>9} {'deadline':>9} "
        f"{'goodput':>8} {'spot h':>8} {'OD h':>8} {'preempt':>8}"
    ]
    optimum = any(s.mean_vs_optimum is not None for s in summaries)
    if optimum:
        lines[0] += f" {'vs optimum':>16}"
    for s in summaries:
        share = f"{s.mean_cost / baseline:.0%}" if baseline else "n/a"
        mark = "  <- recommended" if s.strategy == recommended else ""
        lines.append(
            f"{s.strategy:<18} {'$' + format(s.mean_cost, ',.2f'):>11} {share:>6} "
            f"{_hours(s.mean_finish_h):>9} {s.deadline_met:>9.0%} {s.mean_goodput:>8.1%} "
            f"{s.mean_spot_hours:>8.1f} {s.mean_on_demand_hours:>8.1f} "
            f"{s.mean_preemptions:>8.1f}"
            + (f" {versus(s.mean_vs_optimum, s.worst_vs_optimum):>16}" if optimum else "")
            + mark
        )
    if optimum:
        lines.append(
            "vs optimum: the mean (worst) of each run's cost over the cheapest schedule that "
            "meets the deadline from the same start, known in advance; runs that met it"
        )
    return "\n".join(lines)


def versus(mean: float | None, worst: float | None) -> str:
    """Ratios to the optimum as the tables show them: mean (worst)."""
    return "n/a" if mean is None or worst is None else f"{mean:.3f}x ({worst:.2f}x)"


def sweep(
    summaries_at: Callable[[float], Sequence[Summary]], slacks: Sequence[float] = SLACKS
) -> dict[str, list[tuple[float, float, float]]]:
    """(slack, cost as a share of on-demand, deadline met) per strategy over `slacks`."""
    curves: dict[str, list[tuple[float, float, float]]] = {}
    for slack in slacks:
        summaries = summaries_at(slack)
        baseline = next(s.mean_cost for s in summaries if s.strategy == ON_DEMAND_ONLY)
        for s in summaries:
            curves.setdefault(s.strategy, []).append(
                (slack, s.mean_cost / baseline, s.deadline_met)
            )
    return curves


def save_figure(figure: Any, path: Path) -> None:
    """Write a matplotlib figure, or one error naming the path and the fix (the path's folder
    and type were checked before the work began; a disk can still be full or read-only)."""
    import matplotlib.pyplot as plt

    try:
        figure.savefig(path, dpi=120)
    except OSError as error:
        raise CostInputError(
            f"the figure {path} cannot be written ({error.strerror or error}): give --plot "
            "a file in a folder you may write"
        ) from None
    finally:
        plt.close(figure)


STYLES = {
    "spot-greedy": ("s", "--"),
    "blueprint-mix": ("^", "-."),
    "uniform-progress": ("D", ":"),
    "outage-fill": ("o", "-"),
}
"""Marker and dash per strategy, so lines that coincide (a mix that is all on-demand on one
machine) stay visible, each drawn over the next."""


def plot(
    curves: Mapping[str, Sequence[tuple[float, float, float]]], path: Path, title: str, *,
    deadline_slack: float | None = None, deadline_label: str = "",
) -> list[str]:  # fmt: skip
    """Cost (share of on-demand) per strategy against deadline slack; misses marked, and the
    deadline the user gave (`deadline_slack`) as a line. The legend shows only what is drawn;
    its entries are returned."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.2), layout="constrained")
    missed_drawn = False
    for strategy, points in curves.items():
        slacks = [p[0] for p in points]
        shares = [p[1] for p in points]
        if strategy == ON_DEMAND_ONLY:  # the baseline: a wide band under the others
            axes.plot(slacks, shares, linewidth=7, alpha=0.3, color="gray", label=strategy,
                      zorder=1)  # fmt: skip
        else:
            marker, dashes = STYLES.get(strategy, ("o", "-"))
            axes.plot(slacks, shares, marker=marker, linestyle=dashes, markersize=5,
                      label=strategy, zorder=2)  # fmt: skip
        missed = [(p[0], p[1]) for p in points if p[2] < 1.0]
        if missed:
            label = None if missed_drawn else "misses the deadline in some runs"
            axes.scatter(*zip(*missed, strict=True), marker="x", s=80, color="black", zorder=3,
                         label=label)  # fmt: skip
            missed_drawn = True
    if deadline_slack is not None:
        label = f"your deadline ({deadline_label})" if deadline_label else "your deadline"
        axes.axvline(deadline_slack, color="firebrick", linestyle=":", zorder=0, label=label)
    axes.set_xlabel("deadline slack (deadline = work x (1 + slack))")
    axes.set_ylabel("expected cost / on-demand cost")
    axes.set_ylim(bottom=0)
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    legend = axes.legend(fontsize=8)
    entries = [text.get_text() for text in legend.get_texts()]
    save_figure(figure, path)
    return entries

"""Draw the benchmarks' scaling curves from their committed records, one figure (no measuring).

Usage::

    python experiments/bench/plot_curves.py                 # -> experiments/bench/results/curves.png
    python experiments/bench/plot_curves.py --out /tmp/c.png

Panels, each log-log against the size that grows, from the JSON records under ``results/``
(a missing record leaves its panel saying so):

- the what-if analysis, seconds against workers (``whatif.json``: step-level traces and AR tiled
  along DP; ``whatif_30m.json``: AR tiled with 4x the steps), with a slope-1 guide through the
  first point: a curve parallel to it grows linearly;
- loading, ns per op against ops (``load.json``, this checkout and the one it was compared with),
  the issue's goal of 100 ns per op drawn as a line;
- building the contention model, seconds against ranks (``contention.json``, sparse and dense);
- one controller decision, microseconds against ranks (``controllers.json``, bare, this checkout);
- the streamed simulator, wall seconds against ranks (``sim_streamed.json``), the goal of 90 s at
  65,536 ranks drawn as a point, and the 65,536-rank command run alone (``sim_streamed_65536.json``).

The figure says which records it drew and their commits in its title lines; the numbers are the
records', so a re-run of a benchmark and of this script redraws the curve.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def _record(name: str) -> dict[str, Any] | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.is_file() else None


def _commit(record: dict[str, Any]) -> str:
    commit = (record.get("pacectl") or {}).get("commit") or "?"
    return str(commit)[:7]


def _whatif(ax: Any, record: dict[str, Any]) -> None:
    long = _record("whatif_30m.json")
    rows = [r for r in record["results"] if "workers" in r]
    for kind, label in (
        ("steplevel", "step-level, 500 iterations"),
        ("bytedance", "AR tiled, x PP 4, 44 steps"),
    ):
        pts = sorted((r["workers"], r["analysis_s"]) for r in rows if r.get("kind") == kind)
        if pts:
            ax.plot(*zip(*pts, strict=True), "o-", label=label)
    if long is not None:
        pts = [(r["workers"], r["analysis_s"]) for r in long["results"] if "workers" in r]
        ax.plot(*zip(*pts, strict=True), "s", label="AR tiled, 176 steps (30 M ops)")
    first = min(((r["workers"], r["analysis_s"]) for r in rows), default=None)
    if first is not None:
        x0, y0 = first
        ax.plot([x0, 4096], [y0, y0 * 4096 / x0], ":", color="grey", label="linear (slope 1)")
    ax.set(xlabel="workers", ylabel="analysis, s", title="what-if analysis")


def _load(ax: Any, record: dict[str, Any]) -> None:
    rows = record["results"]
    for kind in ("bytedance", "steplevel"):
        pts = sorted((r["num_ops"], r["ns_per_op"]) for r in rows if r["kind"] == kind)
        old = sorted(
            (r["num_ops"], r["against"]["ns_per_op"]) for r in rows if r["kind"] == kind and "against" in r
        )
        if pts:
            ax.plot(*zip(*pts, strict=True), "o-", label=f"{kind}, this")
        if old:
            ax.plot(
                *zip(*old, strict=True),
                "x--",
                label=f"{kind}, {str((record.get('against_git') or {}).get('commit'))[:7]}",
            )
    ax.axhline(100, color="grey", ls=":", label="goal: 100 ns per op")
    ax.set(xlabel="ops", ylabel="ns per op", title="loading")


def _contention(ax: Any, record: dict[str, Any]) -> None:
    rows = sorted(record["results"], key=lambda r: r["num_ranks"])
    ax.plot([r["num_ranks"] for r in rows], [r["build_s"] for r in rows], "o-", label="sparse (built)")
    dense = [(r["num_ranks"], r["dense_solves_s"]) for r in rows if r.get("dense_solves_s")]
    if dense:
        ax.plot(*zip(*dense, strict=True), "x--", label="dense solves")
    ax.set(xlabel="ranks", ylabel="s", title="contention model, every cross-traffic state")


def _controllers(ax: Any, record: dict[str, Any]) -> None:
    rows = [r for r in record["results"] if r["checkout"] == "this" and not r["guarded"]]
    for name in sorted({r["controller"] for r in rows}):
        pts = sorted((r["num_ranks"], r["us_per_decision"]) for r in rows if r["controller"] == name)
        ax.plot(*zip(*pts, strict=True), ".-", label=name)
    ax.set(xlabel="ranks", ylabel="µs per decision", title="one controller decision (bare)")


def _sim(ax: Any, record: dict[str, Any]) -> None:
    for checkout, style in (("this", "o-"), ("against", "x--")):
        pts = sorted((r["ranks"], r["wall_s"]) for r in record["results"] if r["checkout"] == checkout)
        if pts:
            label = "this" if checkout == "this" else str((record.get("against_git") or {}).get("commit"))[:7]
            ax.plot(*zip(*pts, strict=True), style, label=label)
    alone = _record("sim_streamed_65536.json")
    if alone is not None:  # the 65,536-rank command run alone on a quiet machine
        pts = [(r["ranks"], r["wall_s"]) for r in alone["results"] if r["checkout"] == "this"]
        ax.plot(*zip(*pts, strict=True), "D", label=f"run alone ({_commit(alone)})")
    ax.plot([65536], [90], "*", color="grey", markersize=10, label="goal: 90 s")
    ax.set(xlabel="ranks", ylabel="wall, s", title="simulator, 1,000 iterations, every controller")


#: (record, the panel that draws it), in the figure's order.
PANELS = (
    ("whatif.json", _whatif),
    ("load.json", _load),
    ("contention.json", _contention),
    ("controllers.json", _controllers),
    ("sim_streamed.json", _sim),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "curves.png", help="the PNG to write")
    args = parser.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pacectl.files import atomic_path

    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    drawn = []
    for (name, panel), ax in zip(PANELS, axes.flat, strict=False):
        record = _record(name)
        if record is None:
            ax.text(0.5, 0.5, f"no {name}", ha="center", va="center", transform=ax.transAxes)
            drawn.append(f"{name} missing")
        else:
            panel(ax, record)
            drawn.append(f"{name} {_commit(record)}")
    axes.flat[-1].axis("off")
    for ax in axes.flat[:-1]:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(
        "pacectl benchmarks (records and their commits, '?' where a record names none: "
        + ", ".join(drawn)
        + ")",
        fontsize=9,
    )
    fig.tight_layout()
    with atomic_path(args.out) as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

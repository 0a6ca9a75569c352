"""The performance page's charts, drawn with matplotlib from a results file.

A results file is what `python -m bench --json PATH` writes (a Report: its `rows`, each
with `scenario`, `unit`, `ours`, `raw`, `raw_label`, `target` and `ratio`), or the
performance page's own docs/performance/results.json, whose rows add `low` and `high`
(the range of the ratio over rounds or runs) and `date`. Two charts:

- ratios.png: every row's ratio (ours ÷ the figure it is compared with in the same
  run), its range, and its target where the target is a ratio;
- pgmq.png: the SQL engine against PGMQ, timed and counted, postbox ÷ PGMQ as
  throughput (for instruction counts, PGMQ's count ÷ ours), with the targets.

`python -m bench --charts RESULTS [--charts-dir DIR]` redraws them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display, no GUI toolkit

import matplotlib.pyplot as plt

# A target the chart can draw: ">= 0.7", ">= 1.2x PGMQ", "≥ 0.35 of raw".
_RATIO_TARGET = re.compile(r"(?:>=|≥)\s*([\d.]+)\s*(?:x|of\b)")
# Units whose figure is a cost: more is worse, so the chart inverts their ratio.
_COST_UNITS = ("instr/msg",)
# Fixed metadata, so the same figures draw the same bytes (no matplotlib version or date).
_PNG_METADATA = {"Software": None}


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    low: float | None = None
    high: float | None = None
    target: float | None = None


def ratio_target(target: Any) -> float | None:
    """The number of a ratio target ('>= 0.7 of raw', '>= 1.2x PGMQ'), else None."""
    if isinstance(target, (int, float)):
        return float(target)
    match = _RATIO_TARGET.search(str(target or ""))
    return float(match.group(1)) if match else None


def _ratio(row: dict[str, Any]) -> float | None:
    if row.get("ratio") is not None:
        return float(row["ratio"])
    if row.get("raw"):
        return float(row["ours"]) / float(row["raw"])
    return None


def _label(row: dict[str, Any]) -> str:
    date = f", {row['date']}" if row.get("date") else ""
    return f"{row['scenario']} ({row.get('raw_label') or 'comparison'}{date})"


def ratio_bars(rows: Sequence[dict[str, Any]]) -> list[Bar]:
    """Every row with a ratio and no cost unit, as the bench prints it."""
    bars = []
    for row in rows:
        ratio = _ratio(row)
        if ratio is None or row.get("unit") in _COST_UNITS:
            continue
        target = ratio_target(row.get("target"))
        bars.append(Bar(_label(row), ratio, row.get("low"), row.get("high"), target))
    return bars


def pgmq_bars(rows: Sequence[dict[str, Any]]) -> list[Bar]:
    """Rows compared with PGMQ, as postbox ÷ PGMQ throughput (counts inverted)."""
    bars = []
    for row in rows:
        ratio = _ratio(row)
        if ratio is None or not str(row.get("raw_label", "")).startswith("PGMQ"):
            continue
        low, high = row.get("low"), row.get("high")
        if row.get("unit") in _COST_UNITS:
            ratio = 1 / ratio
            low, high = (1 / high if high else None), (1 / low if low else None)
        bars.append(Bar(_label(row), ratio, low, high, ratio_target(row.get("target"))))
    return bars


def _draw(bars: Sequence[Bar], title: str, xlabel: str, path: Path) -> Path:
    height = 1.2 + 0.42 * len(bars)
    figure, axes = plt.subplots(figsize=(11, height), layout="constrained")
    positions = list(range(len(bars)))[::-1]  # the first row on top
    met = [bar.target is None or bar.value >= bar.target for bar in bars]
    axes.barh(
        positions,
        [bar.value for bar in bars],
        color=["#3b7dd8" if ok else "#d8833b" for ok in met],
        height=0.6,
    )
    for y, bar in zip(positions, bars, strict=True):
        if bar.low is not None and bar.high is not None:
            axes.plot([bar.low, bar.high], [y, y], color="black", linewidth=1.2)
        if bar.target is not None:
            axes.plot([bar.target, bar.target], [y - 0.4, y + 0.4], color="#b00020", linewidth=2)
        axes.annotate(
            f"{bar.value:.2f}",
            (max(bar.value, bar.high or 0, bar.target or 0), y),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    axes.set_yticks(positions, [bar.label for bar in bars], fontsize=8)
    axes.set_xscale("log")
    widest = max(max(bar.value, bar.high or 0, bar.target or 0) for bar in bars)
    left, right = min(bar.low or bar.value for bar in bars) * 0.8, widest * 1.6
    axes.set_xlim(left, right)
    ticks = [t for t in (0.1, 0.2, 0.35, 0.5, 0.7, 1, 1.2, 2, 5, 10) if left <= t <= right]
    axes.set_xticks(ticks, [f"{t:g}" for t in ticks])
    axes.minorticks_off()
    axes.axvline(1.0, color="grey", linewidth=0.8, linestyle=":")
    axes.set_xlabel(xlabel)
    axes.set_title(title, fontsize=10)
    axes.plot([], [], color="black", linewidth=1.2, label="range over rounds or runs")
    axes.plot([], [], color="#b00020", linewidth=2, label="target")
    axes.legend(loc="lower right", fontsize=8)
    figure.savefig(path, dpi=110, metadata=_PNG_METADATA)
    plt.close(figure)
    return path


def draw(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """Draws the charts of a results file into out_dir; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = results["rows"]
    written = []
    ratios = ratio_bars(rows)
    if ratios:
        written.append(
            _draw(
                ratios,
                "ours ÷ the figure it is compared with in the same run (orange: below target)",
                "ratio (log scale; 1 = level with the comparison)",
                out_dir / "ratios.png",
            )
        )
    against_pgmq = pgmq_bars(rows)
    if against_pgmq:
        written.append(
            _draw(
                against_pgmq,
                "the SQL engine against PGMQ 1.5.1: postbox ÷ PGMQ as throughput",
                "postbox ÷ PGMQ (log scale; for instruction counts, PGMQ's count ÷ ours)",
                out_dir / "pgmq.png",
            )
        )
    return written


def draw_file(results_path: Path, out_dir: Path | None = None) -> list[Path]:
    """Draws the charts of a results file, beside it unless out_dir says where."""
    results = json.loads(results_path.read_text())
    return draw(results, out_dir or results_path.parent)

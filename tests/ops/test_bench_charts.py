"""The bench's charts: `python -m bench --charts` draws the performance page's PNGs from a
results file, the committed one and one in the shape `python -m bench --json` writes."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

from bench.charts import pgmq_bars, ratio_bars, ratio_target
from bench.runner import Report, Row

ROOT = Path(__file__).resolve().parents[2]
PERFORMANCE = ROOT / "docs" / "performance"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, which follows its 8-byte signature."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def draw(results: Path, out: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--charts", str(results), "--charts-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_committed_charts_are_drawn_from_the_committed_figures(tmp_path: Path) -> None:
    """Redrawn from results.json, each chart has the committed one's size: a bar per row,
    so a row added to the figures without redrawing (or the reverse) changes the height."""
    output = draw(PERFORMANCE / "results.json", tmp_path)
    for name in ("ratios.png", "pgmq.png"):
        assert f"drew {tmp_path / name}" in output
        assert png_size(tmp_path / name) == png_size(PERFORMANCE / name), name


def test_the_performance_page_shows_every_figure_and_chart() -> None:
    page = (PERFORMANCE / "index.md").read_text()
    for row in json.loads((PERFORMANCE / "results.json").read_text())["rows"]:
        assert f"| {row['scenario']} (`{row['bench']}`) |" in page, row["scenario"]
    assert "](ratios.png)" in page
    assert "](pgmq.png)" in page


def test_a_run_written_by_the_bench_draws(tmp_path: Path) -> None:
    """A Report as `--json` writes it: rate rows are drawn as ratios, instruction counts
    only against PGMQ and inverted, rows without a comparison nowhere."""
    report = Report(
        rows=[
            Row("SendBatch(500) x4", "msgs/s", 7_000, 10_000, "raw INSERT", ">= 0.7 of raw"),
            Row("SQL send 1 x64", "msgs/s", 12_000, 10_000, "PGMQ 1.5.1, pgbench", ">= 1.2x PGMQ"),
            Row("SQL send 1, CPU", "instr/msg", 200_000, 300_000, "PGMQ 1.5.1, callgrind"),
            Row("1000 idle streams", "% CPU", 0.5),
        ]
    )
    results = tmp_path / "run.json"
    report.write(results)
    rows = json.loads(results.read_text())["rows"]

    ratios = ratio_bars(rows)
    assert [(bar.value, bar.target) for bar in ratios] == [(0.7, 0.7), (1.2, 1.2)]
    against_pgmq = pgmq_bars(rows)
    assert [round(bar.value, 2) for bar in against_pgmq] == [1.2, 1.5]

    charts = tmp_path / "charts"
    draw(results, charts)
    # Two bars each: the same figure size.
    assert png_size(charts / "ratios.png") == png_size(charts / "pgmq.png")


def test_targets_the_bench_prints_are_read_as_ratios() -> None:
    assert ratio_target(">= 0.7 of raw") == 0.7
    assert ratio_target(">= 1.2x PGMQ") == 1.2
    assert ratio_target("≥ 0.35 of raw") == 0.35
    assert ratio_target(">= 3") is None  # a count, not a ratio
    assert ratio_target("") is None

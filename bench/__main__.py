"""`python -m bench`: runs the scenarios against one database and prints the table."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from bench.database import BenchDatabase
from bench.runner import SCENARIOS, Context, Report, describe_machine, machine_load, table
from bench.scenarios import LONG


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("POSTBOX_BENCH_DATABASE_URL"),
        help="superuser URL of a PostgreSQL to create the run's database on "
        "(default: an embedded PostgreSQL)",
    )
    parser.add_argument(
        "--apply-sql",
        type=Path,
        action="append",
        help="run this SQL file after installing the engine: measure a proposed engine change",
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON to this path")
    parser.add_argument("--seconds", type=float, default=5.0, help="measuring time per figure")
    parser.add_argument("--body-size", type=int, default=100, help="message body bytes")
    parser.add_argument(
        "--sustained-seconds", type=float, default=900.0, help="length of the sustained run"
    )
    parser.add_argument(
        "--sustained-rate", type=float, default=200.0, help="msgs/s of the sustained run"
    )
    parser.add_argument(
        "--spark-rows",
        type=int,
        default=1_000_000,
        help="rows the spark_write scenario writes each way",
    )
    parser.add_argument(
        "--soak-seconds", type=float, default=3600.0, help="length of the soak run's load"
    )
    parser.add_argument(
        "--spiral-phase-seconds",
        type=float,
        default=600.0,
        help="length of each of death_spiral's three phases",
    )
    parser.add_argument(
        "--spiral-rate",
        type=float,
        default=1000.0,
        help="msgs/s of each of death_spiral's producers",
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="sustained run without the transaction that pins the xmin horizon (for comparison)",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="SCENARIO",
        help="run these scenarios (default: all short ones)",
    )
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument(
        "--charts",
        type=Path,
        metavar="RESULTS",
        help="draw the charts of a results file (--json's, or docs/performance/results.json) "
        "and exit; they go beside it unless --charts-dir says where",
    )
    parser.add_argument(
        "--charts-dir",
        type=Path,
        help="where charts go; with a run, draw this run's charts there too",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="print EXPLAIN (ANALYZE, BUFFERS) of the engine's hot statements and exit",
    )
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> Report:
    report = Report()
    names = args.only or [name for name in SCENARIOS if name not in LONG]
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenario(s): {', '.join(unknown)}; see --list")
    async with BenchDatabase(args.database_url, args.apply_sql) as db:
        report.machine = describe_machine(db)
        report.machine["applied_sql"] = [str(p) for p in args.apply_sql or []]
        ctx = Context(
            db,
            args.seconds,
            args.body_size,
            args.sustained_seconds,
            args.sustained_rate,
            sustained_pin=not args.no_pin,
            spark_rows=args.spark_rows,
            soak_seconds=args.soak_seconds,
            spiral_phase_seconds=args.spiral_phase_seconds,
            spiral_rate=args.spiral_rate,
        )
        try:
            for name in names:
                entry = SCENARIOS[name]
                if entry.run is None:
                    report.not_measurable[name] = entry.pending
                    continue
                print(f"... {name}: {entry.description}", file=sys.stderr, flush=True)
                started = time.monotonic()
                try:
                    report.rows.extend(await entry.run(ctx))
                except Exception as exc:
                    traceback.print_exc()
                    report.failed[name] = repr(exc)
                report.seconds[name] = round(time.monotonic() - started, 1)
                await ctx.clean()
        finally:
            ctx.stop_servers()
            report.extra = ctx.extra
        report.machine["after"] = machine_load()
    return report


async def _explain(args: argparse.Namespace) -> str:
    from bench.explain import explain

    async with BenchDatabase(args.database_url, args.apply_sql) as db:
        return await explain(db.url)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # asyncio.run then unwinds: servers stop, the database is dropped


def main(argv: list[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, _interrupt)
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.list:
        for name, entry in SCENARIOS.items():
            marks = " (long: only with --only)" if name in LONG else ""
            state = f" [not measurable yet: {entry.pending}]" if entry.run is None else ""
            print(f"{name}: {entry.description}{marks}{state}")
        return
    if args.explain:
        print(asyncio.run(_explain(args)))
        return
    if args.charts:
        from bench.charts import draw_file

        for path in draw_file(args.charts, args.charts_dir):
            print(f"drew {path}")
        return
    report = asyncio.run(run(args))
    machine = report.machine
    print(
        f"\npostbox bench, {machine['at']}, {machine['cpus']} CPUs, PostgreSQL "
        f"{machine['postgres']}; machine before: load {machine['before']['loadavg']}, "
        f"CPU {machine['before']['cpu_percent']}%; after: load {machine['after']['loadavg']}"
    )
    print(table(report))
    if args.json:
        report.write(args.json)
        print(f"results written to {args.json}")
    if args.charts_dir:
        from bench.charts import draw

        for path in draw(report.to_json(), args.charts_dir):
            print(f"drew {path}")
    if report.failed:
        sys.exit(1)


if __name__ == "__main__":
    main()

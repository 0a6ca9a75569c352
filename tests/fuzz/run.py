#!/usr/bin/env python3
"""Runs one fuzz target under atheris (libFuzzer, coverage-guided).

    python tests/fuzz/run.py TARGET [libFuzzer flags...]

It reads the committed seeds in tests/fuzz/corpus/TARGET and writes what it learns to
a scratch corpus (--keep DIR keeps it), so the committed corpus changes only by hand.
Examples: a short pass, `-runs=20000 -max_total_time=10`; a long one,
`-max_total_time=3600 -jobs=2`. The engine targets (filter_policy, engine_receipts)
need POSTBOX_FUZZ_DATABASE_URL: a database the server has installed its engine in.
A finding is written to -artifact_prefix (default: the scratch directory) and
reproduced with `python tests/fuzz/run.py TARGET FILE`.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import atheris

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"

with atheris.instrument_imports(include=["server", "cronsim", "multidict"]):
    sys.path.insert(0, str(HERE))
    from harnesses import TARGETS


def main() -> int:
    args = sys.argv[1:]
    if not args or args[0] not in TARGETS:
        print(f"usage: run.py TARGET [libFuzzer flags]; targets: {', '.join(TARGETS)}")
        return 2
    target, flags = args[0], args[1:]
    keep = None
    if "--keep" in flags:
        at = flags.index("--keep")
        keep = flags[at + 1]
        del flags[at : at + 2]
    files = [flag for flag in flags if not flag.startswith("-")]
    flags = [flag for flag in flags if flag.startswith("-")]
    scratch = keep or tempfile.mkdtemp(prefix=f"postbox-fuzz-{target}-")
    os.makedirs(scratch, exist_ok=True)
    if not any(flag.startswith("-artifact_prefix=") for flag in flags):
        flags.append(f"-artifact_prefix={scratch}/")
    # Files given: run each once (a finding reproduced). Otherwise: fuzz from the seeds.
    inputs = files or [scratch, str(CORPUS / target)]
    atheris.Setup([sys.argv[0], *flags, *inputs], TARGETS[target])
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The mutation score of each mutated module, from ``mutmut results --all true``.

    python -m tests.support.mutation_score [--min 85]

Prints one line a module: mutants, killed (a test failed, timed out or crashed), survived (every test
passed), no tests (no selected test runs the function), and the score
``killed / (mutants - skipped)`` in percent; then the survivors by name (``mutmut show NAME``
prints one). Exits 1 when a module scores under ``--min``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

# "suspicious" is mutmut's word for any other exit code: the test process died, e.g. llama.cpp
# aborting on a NULL argument; the tests did not pass, so the mutant was noticed
DETECTED = {"killed", "timeout", "segfault", "caught by type check", "suspicious"}
LINE = re.compile(r"^\s+(?P<name>\S+): (?P<status>.+)$")
MODULE = re.compile(r"^(?P<module>.+?)\.x[_ǁ]")


def mutant_statuses() -> dict[str, str]:
    """``{mutant name: status}`` for every mutant mutmut has run."""
    mutmut = Path(sys.executable).with_name("mutmut")
    out = subprocess.run(
        [str(mutmut), "results", "--all", "true"], capture_output=True, text=True, check=True
    ).stdout
    return {m["name"]: m["status"].strip() for m in map(LINE.match, out.splitlines()) if m}


def module_of(name: str) -> str:
    """``inference.routing.x_route_request__mutmut_3`` -> ``inference.routing``."""
    match = MODULE.match(name)
    return match["module"] if match else name.rsplit(".", 1)[0]


def scores(statuses: dict[str, str]) -> dict[str, Counter]:
    by_module: dict[str, Counter] = defaultdict(Counter)
    for name, status in statuses.items():
        counts = by_module[module_of(name)]
        counts["mutants"] += 1
        counts["detected" if status in DETECTED else status] += 1
    return dict(sorted(by_module.items()))


def percent(counts: Counter) -> float:
    considered = counts["mutants"] - counts["skipped"]
    return 100.0 * counts["detected"] / considered if considered else 100.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--min", type=float, default=85.0, help="lowest passing score (%%)")
    args = parser.parse_args()
    statuses = mutant_statuses()
    if not statuses:
        print("no mutants on record: run `mutmut run` first")
        return 1
    table = scores(statuses)
    print(f"{'module':38s} {'mutants':>7s} {'killed':>7s} {'survived':>8s} {'no tests':>8s} score")
    for module, c in table.items():
        print(
            f"{module:38s} {c['mutants']:7d} {c['detected']:7d} {c['survived']:8d} "
            f"{c['no tests']:8d} {percent(c):5.1f}%"
        )
    survivors = sorted(n for n, s in statuses.items() if s not in DETECTED | {"skipped"})
    if survivors:
        print("\nnot killed (mutmut show NAME):")
        for name in survivors:
            print(f"  {name}: {statuses[name]}")
    low = [m for m, c in table.items() if percent(c) < args.min]
    if low:
        print(f"\nunder {args.min:g}%: {', '.join(low)}")
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())

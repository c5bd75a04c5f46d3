"""The real device validation of nodes here, timed: inventory, memory bandwidth, prompt
processing and decode at 1 and 8 sequences through our engine, the compatibility matrix.

One node (the default): starts one node agent with the bundled model (threads 2, 8 sequences of
2,048 tokens, the embedded array's default shape) and a control plane's database under a
temporary PHALANX_HOME, then validates the node through the same services as "validate now"
(``nodes.device_validation``) and prints how long it took from the request to the verdict
(goal: under 60 s on this machine, benchmarks included), the figures, decode at 8 sequences
over decode at 1 (eight sequences share each step, so above 1) and the rules. The last line is
one JSON object: ``seconds``, ``goal_ratio`` (seconds over 60), ``status``, the figures,
``decode_8_over_1``, ``rules``.

``--compare``: two node agents on this machine, each pinned to its own half of the CPUs (and
registered with those CPU sets, as ``up`` registers its nodes), validated one after the other
(the rule with ``PHALANX_VALIDATIONS_TOGETHER=0``) and both at once (the default rule: disjoint
CPU sets may overlap), ``--rounds`` times, the mode that goes first alternating. It prints the wall time of each mode
(both requests to both verdicts) and, per figure, the median over nodes and rounds of the
parallel runs over the serial ones: 1.0 means the runs did not disturb each other; memory
bandwidth below 1 means the two copies shared the memory bus. The last line: ``ratio``
(parallel wall time over serial), ``serial_s``, ``parallel_s``, ``figure_ratios``, ``states``.

    python bench/validation.py [--threads 2]
    python bench/validation.py --compare [--rounds 2] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.harness import emit, start_node  # noqa: E402

GOAL_S = 60.0
FIGURES = ("memory_bandwidth_gb_s", "prompt_tok_s", "decode_tok_s_1", "decode_tok_s_8")


def _setup() -> Path:
    home = Path(tempfile.mkdtemp(prefix="phalanx-validation-"))
    os.environ["PHALANX_HOME"] = str(home)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return home


def validate(node_ids: list[str]) -> tuple[float, list]:
    """Ask for a run of each node at once and step them until all end; returns the wall
    seconds from the requests to the last verdict and the runs."""
    from nodes.device_validation import validation_request, validation_wait

    started = time.perf_counter()
    runs = [validation_request(node_id=n, trigger="demand", requested_by="bench") for n in node_ids]
    runs = [validation_wait(run) for run in runs]
    return time.perf_counter() - started, runs


def one_node(threads: int) -> None:
    home = _setup()
    from nodes.services import node_upsert

    node = start_node("node-01", home, threads=threads)
    try:
        node_upsert(node_id="node-01", address=node.url.removeprefix("http://"), package_id=None)
        seconds, (run,) = validate(["node-01"])
    finally:
        node.stop()
    bench = run.bench or {}
    print(f"validation of one node: {run.state} in {seconds:.1f} s (node side {run.seconds} s)")
    for key in FIGURES:
        print(f"  {key:24} {bench.get(key)}")
    decode_ratio = _ratio(bench.get("decode_tok_s_8"), bench.get("decode_tok_s_1"))
    print(f"  decode at 8 sequences over 1: {decode_ratio} (above 1: the steps are shared)")
    for rule in run.rules:
        print(f"  {rule['status']:4}  {rule['rule']}: {rule['reason']}")
    if run.state == "error":
        print(f"  error: {run.reason}")
    emit(
        {
            "seconds": round(seconds, 2),
            "node_seconds": run.seconds,
            "goal_s": GOAL_S,
            "goal_ratio": round(seconds / GOAL_S, 3),
            "status": {"passed": "pass", "warned": "warn"}.get(run.state, "fail"),
            "state": run.state,
            "threads": threads,
            **{key: bench.get(key) for key in FIGURES},
            "decode_8_over_1": decode_ratio,
            "rules": run.rules,
        }
    )


def _ratio(a, b) -> float | None:
    return (
        round(a / b, 3) if isinstance(a, int | float) and isinstance(b, int | float) and b else None
    )


def _halves() -> tuple[list[int], list[int]]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        sys.exit("--compare needs two CPUs: one for each node")
    half = len(cpus) // 2
    return cpus[:half], cpus[half : 2 * half]


def compare(rounds: int, threads: int) -> None:
    """Serial against parallel validation of two pinned nodes, alternating which goes first."""
    home = _setup()
    from nodes import validation_machines
    from nodes.services import node_upsert

    halves = _halves()
    threads = min(threads, len(halves[0]))
    cpu_sets = [",".join(map(str, half)) for half in halves]
    ids = ["node-01", "node-02"]
    procs = [
        start_node(n, home, threads=threads, cpus=c) for n, c in zip(ids, cpu_sets, strict=True)
    ]
    walls: dict[str, list[float]] = {"serial": [], "parallel": []}
    figures: dict[str, dict[str, list[float]]] = {"serial": {}, "parallel": {}}
    states: list[str] = []
    try:
        for n, p, c in zip(ids, procs, cpu_sets, strict=True):
            address = p.url.removeprefix("http://")
            node_upsert(node_id=n, address=address, package_id=None, cpu_set=c)
        for round_ in range(rounds):
            modes = ("serial", "parallel") if round_ % 2 == 0 else ("parallel", "serial")
            for mode in modes:
                validation_machines.TOGETHER = mode == "parallel"
                seconds, runs = validate(ids)
                walls[mode].append(seconds)
                states += [run.state for run in runs]
                for run in runs:
                    for key in FIGURES:
                        value = (run.bench or {}).get(key)
                        figures[mode].setdefault(f"{run.node.node_id}:{key}", []).append(value)
                print(f"round {round_ + 1} {mode:8} {seconds:6.1f} s  " + _line(runs))
    finally:
        for proc in procs:
            proc.stop()
    _report_compare(walls, figures, states, threads=threads, cpu_sets=cpu_sets)


def _line(runs) -> str:
    return "  ".join(
        f"{run.node.node_id} {run.state} "
        + " ".join(f"{(run.bench or {}).get(k)}" for k in FIGURES)
        for run in runs
    )


def _report_compare(walls, figures, states, *, threads: int, cpu_sets: list[str]) -> None:
    serial, parallel = statistics.median(walls["serial"]), statistics.median(walls["parallel"])
    ratios: dict[str, float | None] = {}
    ok = all(s in ("passed", "warned") for s in states)
    print(f"two nodes (CPUs {' and '.join(cpu_sets)}, threads {threads} each), median wall:")
    print(f"  one after the other {serial:6.1f} s")
    print(f"  both at once        {parallel:6.1f} s   ({parallel / serial:.2f} of serial)")
    print("  figure (parallel over serial, median over nodes and rounds):")
    for key in FIGURES:
        per_node = [
            _ratio(statistics.median(figures["parallel"][name]), statistics.median(values))
            for name, values in figures["serial"].items()
            if name.endswith(key) and None not in values + figures["parallel"][name]
        ]
        known = [r for r in per_node if r is not None]
        ratios[key] = round(statistics.median(known), 3) if known and ok else None
        print(f"    {key:24} {ratios[key]}")
    emit(
        {
            "ratio": round(parallel / serial, 3) if ok else None,
            "serial_s": round(serial, 2),
            "parallel_s": round(parallel, 2),
            "serial_runs_s": [round(s, 2) for s in walls["serial"]],
            "parallel_runs_s": [round(s, 2) for s in walls["parallel"]],
            "figure_ratios": ratios,
            "states": states,
            "threads": threads,
            "cpu_sets": cpu_sets,
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compare", action="store_true", help="serial against parallel")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="--compare with one round")
    args = parser.parse_args()
    if args.compare:
        compare(1 if args.quick else args.rounds, args.threads)
    else:
        one_node(args.threads)


if __name__ == "__main__":
    main()

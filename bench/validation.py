"""The real device validation of one node here, timed: inventory, memory bandwidth, prompt
processing and decode at 1 and 8 sequences through our engine, the compatibility matrix.

Starts one node agent with the bundled model (threads 2, 8 sequences of 2,048 tokens, the
embedded array's default shape) and a control plane's database under a temporary PHALANX_HOME,
then validates the node through the same services as "validate now" (``nodes.device_validation``)
and prints how long it took from the request to the verdict (goal: under 60 s on this machine,
benchmarks included), the figures and the rules. The last line is one JSON object: ``seconds``,
``goal_ratio`` (seconds over 60), ``status``, ``memory_bandwidth_gb_s``, ``prompt_tok_s``,
``decode_tok_s_1``, ``decode_tok_s_8``, ``rules``.

    python bench/validation.py [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.harness import emit, start_node  # noqa: E402

GOAL_S = 60.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="phalanx-validation-"))
    os.environ["PHALANX_HOME"] = str(home)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from nodes.device_validation import validation_request, validation_wait
    from nodes.services import node_upsert

    call_command("migrate", verbosity=0)
    node = start_node("node-01", home, threads=args.threads)
    try:
        node_upsert(node_id="node-01", address=node.url.removeprefix("http://"), package_id=None)
        started = time.perf_counter()
        run = validation_request(node_id="node-01", trigger="demand", requested_by="bench")
        run = validation_wait(run)
        seconds = time.perf_counter() - started
    finally:
        node.stop()
    bench = run.bench or {}
    print(f"validation of one node: {run.state} in {seconds:.1f} s (node side {run.seconds} s)")
    for key in ("memory_bandwidth_gb_s", "prompt_tok_s", "decode_tok_s_1", "decode_tok_s_8"):
        print(f"  {key:24} {bench.get(key)}")
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
            "threads": args.threads,
            "memory_bandwidth_gb_s": bench.get("memory_bandwidth_gb_s"),
            "prompt_tok_s": bench.get("prompt_tok_s"),
            "decode_tok_s_1": bench.get("decode_tok_s_1"),
            "decode_tok_s_8": bench.get("decode_tok_s_8"),
            "rules": run.rules,
        }
    )


if __name__ == "__main__":
    main()

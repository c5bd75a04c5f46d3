"""The tool-call evaluation run against real node agents on the bundled SmolLM2-135M."""

from __future__ import annotations

import json

import pytest

from inference.packages.evaluation.node import REPO_ROOT
from inference.packages.evaluation.runner import evaluate_package
from inference.packages.gguf_files import write_with_chat_template

pytestmark = pytest.mark.model

ROW_KEYS = {
    "id",
    "mode",
    "correct",
    "called",
    "parsed",
    "schema_valid",
    "name_ok",
    "args_ok",
    "answer",
}
MODE_KEYS = {
    "cases",
    "tool_accuracy",
    "json_parse_rate",
    "schema_valid_rate",
    "name_accuracy",
    "args_exact",
    "abstention_accuracy",
    "calls",
}


def test_it_evaluates_the_bundled_model(tmp_path, bundled):
    seen: list[float] = []
    report = evaluate_package(
        bundled, workdir=tmp_path, subset=6, progress=lambda f, what: seen.append(f)
    )
    json.dumps(report)  # JSON-able
    assert report["suite"] == {"version": 1, "cases": 6}
    assert report["smoke"]["passed"] is True, report["smoke"]
    assert [s["name"] for s in report["smoke"]["steps"]] == ["tool_call", "tool_result"]
    grammar, free = report["modes"]["grammar"], report["modes"]["free"]
    assert set(grammar) == MODE_KEYS and set(free) == MODE_KEYS
    assert grammar["cases"] == free["cases"] == 6
    # the grammar makes every call it lets through parse and match its tool's schema
    assert grammar["calls"] >= 1  # SmolLM2 under the grammar calls a tool in these cases
    assert grammar["json_parse_rate"] == 1.0
    assert grammar["schema_valid_rate"] == 1.0
    rows = report["cases"]
    assert grammar["calls"] == sum(row["called"] for row in rows if row["mode"] == "grammar")
    assert len(rows) == 12 and all(set(row) == ROW_KEYS for row in rows)
    assert {row["mode"] for row in rows} == {"grammar", "free"}
    assert sum(row["correct"] for row in rows if row["mode"] == "grammar") == round(
        grammar["tool_accuracy"] * 6
    )
    assert report["speed"]["ttft_ms"] > 0 and report["speed"]["decode_tok_s"] > 0
    assert report["perplexity"] > 1.0 and report["perplexity_tokens"] > 400
    assert seen == sorted(seen) and seen[-1] == 1.0


def test_it_fails_the_smoke_test_of_a_chat_template_that_does_not_render(tmp_path, bundled):
    broken = tmp_path / "broken.gguf"
    write_with_chat_template(bundled, broken, "{{ no_such_helper(messages) }}")
    report = evaluate_package(broken, workdir=tmp_path, subset=6, measure_perplexity=False)
    smoke = report["smoke"]
    assert smoke["passed"] is False
    assert smoke["error"] == (
        "tool_call: HTTP 400 template_error: chat template failed: 'no_such_helper' is undefined"
    )
    assert smoke["steps"] == [{"name": "tool_call", "ok": False, "detail": smoke["error"][11:]}]
    assert (report["modes"], report["cases"], report["speed"], report["perplexity"]) == (
        {},
        [],
        None,
        None,
    )


def test_it_reports_a_node_that_does_not_start_as_a_failed_smoke_test(tmp_path):
    not_gguf = tmp_path / "not.gguf"
    not_gguf.write_bytes(b"this is not a GGUF file\n" * 64)
    report = evaluate_package(not_gguf, workdir=tmp_path, subset=6, measure_perplexity=False)
    smoke = report["smoke"]
    assert smoke["passed"] is False
    assert smoke["error"].startswith("the node could not load the model") or smoke[
        "error"
    ].startswith("the node exited")
    assert [s["name"] for s in smoke["steps"]] == ["start"]
    assert report["modes"] == {} and report["cases"] == []


def test_an_evaluation_node_dies_with_the_job_process_that_started_it(tmp_path, bundled):
    """A job process killed with SIGKILL (a stopped array, the OOM killer) runs no cleanup;
    its evaluation node must not live on as an orphan holding a core and a port."""
    import signal
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import django, os, sys, time
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
        django.setup()
        from inference.packages.evaluation.node import start_eval_node
        node = start_eval_node({str(bundled)!r}, log_path={str(tmp_path / "node.log")!r})
        print(node.process.pid, flush=True)
        time.sleep(600)
        """
    )
    job = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT
    )
    try:
        node_pid = int(job.stdout.readline())
        assert not until_gone(node_pid, timeout=0.5)  # up and serving
        job.send_signal(signal.SIGKILL)
        job.wait(10)
        assert until_gone(node_pid, timeout=20), "the evaluation node outlived its job"
    finally:
        job.kill()


def until_gone(pid: int, *, timeout: float) -> bool:
    """Whether process ``pid`` ended (or is a zombie: ended, not yet reaped) within
    ``timeout`` seconds."""
    import time

    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return False

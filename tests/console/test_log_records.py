"""Log records (console/lib/logs.py): every field a turn binds, and no secret, whatever logs it."""

from __future__ import annotations

import io
import json
import logging

import pytest

from console.lib import logs

API_TOKEN = "phx_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0U1v"
JOIN_TOKEN = "phxj_" + "z" * 43
CREDENTIAL = "phx2." + "ab12" * 16
NODE_SECRET = "0f" * 32


def rendered(kind: str, emit) -> str:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.formatter(kind))
    logger = logging.getLogger("tests.records")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        emit(logger)
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
        logs.unbind()
    return out.getvalue()


@pytest.mark.parametrize("kind", ["text", "json"])
def test_no_secret_reaches_a_record_wherever_it_hides(kind) -> None:
    def emit(logger: logging.Logger) -> None:
        logs.bind(request_id="r-1")
        logger.warning("caller sent Authorization: Bearer %s", API_TOKEN)
        logger.info("join with %s as %s", JOIN_TOKEN, CREDENTIAL, extra={"secret": NODE_SECRET})
        try:
            raise RuntimeError(f"could not use {CREDENTIAL}")
        except RuntimeError:
            logger.exception("failed with bearer %s", NODE_SECRET)

    text = rendered(kind, emit)
    for secret in (API_TOKEN, JOIN_TOKEN, CREDENTIAL, NODE_SECRET, API_TOKEN[4:20]):
        assert secret not in text
    assert text.count(logs.REDACTED) >= 6
    assert "caller sent Authorization" in text and "could not use" in text


def test_a_json_record_names_time_level_process_and_the_bound_fields() -> None:
    def emit(logger: logging.Logger) -> None:
        logs.bind(request_id="r-2", session_id="s-2", node_id="node-03", package="m:1")
        logger.info("answer closed", extra={"status": 200})

    record = json.loads(rendered("json", emit))
    assert record["event"] == "answer closed" and record["level"] == "info"
    assert record["logger"] == "tests.records" and record["process"]
    assert record["time"].endswith("Z") and record["status"] == 200
    fields = ("request_id", "session_id", "node_id", "package")
    assert [record[f] for f in fields] == ["r-2", "s-2", "node-03", "m:1"]


def test_a_request_object_with_a_token_in_its_url_is_redacted() -> None:
    class Request:  # what django.request logs: its text is the URL with the query string
        def __str__(self) -> str:
            return f"<ASGIRequest: GET '/v1/models?token={API_TOKEN}'>"

    for kind in ("text", "json"):
        text = rendered(kind, lambda logger: logger.warning("no", extra={"request": Request()}))
        assert API_TOKEN not in text and "/v1/models?token=" in text


def test_no_message_or_value_can_forge_a_record_or_a_field() -> None:
    forged = "x\n2030-01-01T00:00:00Z CRITICAL nodes.joining: node-99 joined request_id=FORGED"

    def emit(logger: logging.Logger) -> None:
        logs.bind(session_id="x request_id=FORGED node_id=node-99", request_id="r-3")
        logger.warning("node-01 broke an answer: %s", forged)

    text = rendered("text", emit)
    assert text.count("\n") == 1  # one record, one line
    assert " request_id=r-3" in text and " request_id=FORGED" not in text.split("answer:")[0]
    assert 'session_id="x request_id=FORGED node_id=node-99"' in text

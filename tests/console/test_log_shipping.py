"""Shipping log records (console/lib/log_shipping.py): a process that cannot reach the control
plane keeps its records (in its spool, within the bound) and sends them, in order, when it can;
logging never waits for the destination."""

from __future__ import annotations

import json
import logging
import threading
import time

from console.lib import logs
from console.lib.log_shipping import (
    Refused,
    Shipper,
    ShippingHandler,
    Spool,
    Undelivered,
    batches,
)


class Destination:
    """Takes batches while ``up``; raises ``Undelivered`` while down."""

    def __init__(self) -> None:
        self.up = False
        self.lines: list[str] = []

    def __call__(self, batch) -> None:
        if not self.up:
            raise Undelivered("connection refused")
        self.lines.extend(batch)


def test_a_cut_off_process_spools_and_ships_everything_in_order_when_back(tmp_path) -> None:
    destination = Destination()
    shipper = Shipper(destination, spool=Spool(tmp_path / "node.jsonl", 1 << 20))
    for i in range(300):
        shipper.offer(json.dumps({"event": f"turn {i}"}))
        if i % 100 == 99:
            shipper.flush()  # the control plane is down: into the spool
    assert destination.lines == [] and shipper.spooled == 300
    assert len(Spool(tmp_path / "node.jsonl", 1 << 20).lines()) == 300
    shipper.offer(json.dumps({"event": "turn 300"}))
    destination.up = True
    shipper.flush()
    assert [json.loads(x)["event"] for x in destination.lines] == [f"turn {i}" for i in range(301)]
    assert shipper.dropped == 0 and shipper.shipped == 301
    assert Spool(tmp_path / "node.jsonl", 1 << 20).lines() == []


def test_a_spool_keeps_the_newest_lines_within_its_bound(tmp_path) -> None:
    spool = Spool(tmp_path / "s.jsonl", max_bytes=1000)
    lines = [f'{{"event": "line {i:04d}"}}' for i in range(100)]  # 22 bytes + newline each
    dropped = spool.add(lines[:30]) + spool.add(lines[30:])
    kept = spool.lines()
    assert kept == lines[-len(kept) :] and dropped == 100 - len(kept)
    assert 1000 - 23 < len(kept) * 23 <= 1000


def test_without_a_spool_undelivered_lines_wait_in_the_buffer_ahead_of_new_ones() -> None:
    destination = Destination()
    shipper = Shipper(destination)
    shipper.offer("a")
    shipper.flush()
    shipper.offer("b")
    destination.up = True
    shipper.flush()
    assert destination.lines == ["a", "b"] and shipper.dropped == 0


def test_a_full_buffer_drops_its_oldest_lines_and_counts_them() -> None:
    shipper = Shipper(Destination(), buffer_bytes=100)
    for i in range(50):
        shipper.offer(f"line-{i:03d}")  # 8 bytes
    assert shipper.dropped == 38
    destination = Destination()
    destination.up = True
    shipper.deliver = destination
    shipper.flush()
    assert destination.lines == [f"line-{i:03d}" for i in range(38, 50)]


def test_a_batch_the_destination_refuses_is_dropped_and_the_rest_sent() -> None:
    sent: list[str] = []

    def deliver(batch) -> None:
        if "bad" in batch:
            raise Refused("line 1: not JSON")
        sent.extend(batch)

    shipper = Shipper(deliver)
    for line in ["x" * 600_000, "bad", "y" * 600_000]:  # past a batch (512 KiB): one a batch
        shipper.offer(line)
    shipper.flush()
    assert [len(s) for s in sent] == [600_000, 600_000] and shipper.dropped == 1


def test_batches_stay_within_their_size() -> None:
    cut = batches(["a" * 10] * 10, max_bytes=33)
    assert [len(b) for b in cut] == [3, 3, 3, 1]


def test_logging_never_waits_for_a_stuck_destination() -> None:
    release = threading.Event()
    shipper = Shipper(lambda batch: release.wait(30), interval_s=0.01)
    shipper.start()
    try:
        shipper.offer("first")
        time.sleep(0.1)  # the thread now waits inside deliver
        started = time.monotonic()
        for i in range(2000):
            shipper.offer(f"line {i}")
        assert time.monotonic() - started < 1.0
    finally:
        release.set()
        shipper.stop()


def test_the_handler_ships_each_record_as_redacted_json_with_its_bound_fields() -> None:
    shipper = Shipper(Destination())
    handler = ShippingHandler(shipper)
    logger = logging.getLogger("tests.shipping")
    logger.addHandler(handler)
    try:
        logs.bind(request_id="req-9", session_id="s-9")
        logger.warning("presented Bearer %s", "phx_" + "Q" * 40, extra={"status": 502})
    finally:
        logger.removeHandler(handler)
        logs.unbind()
    (line,) = shipper._take()
    record = json.loads(line)
    assert record["event"] == "presented [redacted]" and record["level"] == "warning"
    assert record["request_id"] == "req-9" and record["session_id"] == "s-9"
    assert record["status"] == 502 and record["process"] and record["time"]


def test_a_spool_cut_mid_character_loses_nothing_else(tmp_path) -> None:
    (tmp_path / "node.jsonl").write_bytes(b'{"event":"a"}\n{"event":"\xe2\x82')
    destination = Destination()
    destination.up = True
    shipper = Shipper(destination, spool=Spool(tmp_path / "node.jsonl", 1 << 20))
    shipper.offer('{"event":"b"}')
    shipper.flush()
    assert destination.lines[0] == '{"event":"a"}' and destination.lines[-1] == '{"event":"b"}'
    assert len(destination.lines) == 3 and shipper.dropped == 0

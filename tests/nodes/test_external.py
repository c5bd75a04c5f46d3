"""The load of an external OpenAI-compatible server from what it publishes
(``nodes.external.external_load``): llama-server's ``/slots`` and ``/metrics``, vLLM's metrics."""

from __future__ import annotations

from nodes.external import external_load


def test_it_reads_busy_slots_and_the_queue_of_a_llama_server():
    slots = [{"id": 0, "is_processing": True}, {"id": 1, "is_processing": False}]
    load = external_load(slots, {"llamacpp:requests_deferred": 3.0})
    assert load == {"load": 2.0, "active": 1.0, "queue": 3.0, "total": 2.0}


def test_without_slots_it_counts_busy_and_waiting_requests():
    samples = {"vllm:num_requests_running": 5.0, "vllm:num_requests_waiting": 2.0}
    assert external_load(None, samples) == {"load": 7.0, "active": 5.0, "queue": 2.0, "total": None}
    busy = external_load(None, {"llamacpp:requests_processing": 1.0})
    assert busy == {"load": 1.0, "active": 1.0, "queue": None, "total": None}


def test_a_server_that_publishes_nothing_has_an_unknown_load():
    assert external_load(None, None) is None
    assert external_load([], {"unrelated": 1.0}) is None
    assert external_load({"not": "a list"}, {}) is None

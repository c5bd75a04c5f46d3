"""The load of an external OpenAI-compatible server from what it publishes
(``nodes.external.external_load``): llama-server's ``/slots`` and ``/metrics``, vLLM's metrics."""

from __future__ import annotations

from nodes.external import external_load
from nodes.metrics import parse_prometheus


def test_it_reads_busy_slots_and_the_queue_of_a_llama_server():
    slots = [{"id": 0, "is_processing": True}, {"id": 1, "is_processing": False}]
    load = external_load(slots, {"llamacpp:requests_deferred": 3.0})
    assert load == {"load": 2.0, "active": 1.0, "queue": 3.0, "total": 2.0}


def test_without_slots_a_server_that_queues_is_over_1_and_one_that_does_not_under():
    metrics = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="llama-70b"} 4.0\n'
        'vllm:num_requests_waiting{model_name="llama-70b"} 2.0\n'
    )
    queued = external_load(None, parse_prometheus(metrics))  # what vLLM really publishes
    assert queued == {"load": 1.5, "active": 4.0, "queue": 2.0, "total": None}
    room = external_load(None, parse_prometheus(metrics.replace("} 2.0", "} 0")))
    assert room == {"load": 0.8, "active": 4.0, "queue": 0.0, "total": None}
    busy = external_load(None, {"llamacpp:requests_processing": 1.0})
    assert busy == {"load": 0.5, "active": 1.0, "queue": None, "total": None}


def test_a_server_that_publishes_nothing_has_an_unknown_load():
    assert external_load(None, None) is None
    assert external_load([], {"unrelated": 1.0}) is None
    assert external_load({"not": "a list"}, {}) is None

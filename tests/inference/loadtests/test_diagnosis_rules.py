"""Each rule of the findings on a plain report, at its thresholds, with every word a user reads
in the finding (symptom, cause, evidence, check, remedy, severity)."""

from __future__ import annotations

from inference.loadtests.diagnosis import diagnose
from tests.inference.loadtests.synthetic import turn

STALL = (
    "per-stream decode fell from 40.0 tok/s at 1 sessions to 12.3 at 4, while array throughput "
    "went from 40 to 50 tok/s"
)


def findings(turns=(), sessions=(), **report):
    """``diagnose`` of a report holding only ``report``'s sections (the rest empty)."""
    sections = {
        "steps": [],
        "nodes": [],
        "tool_calls": {"required": 0, "valid": 0, "truncated": 0, "validity": None},
        "ttft_split": {"queue_p95_ms": None},
        "errors": [],
        "control_plane": {},
    }
    return diagnose({**sections, **report}, list(turns), list(sessions))


def rules_of(found):
    return [f["rule"] for f in found]


def step(c, decode, tps, **cpu):
    return {"concurrency": c, "stream_decode_tps": decode, "tokens_per_s": tps, **cpu}


def node(name, requests=10, cpu=None, share=0.5):
    return {"node": name, "requests": requests, "cpu_mean": cpu, "share": share}


def stalled(**cpu):
    """Steps whose streams stall from 40 to 12.34 tok/s while throughput goes 40 -> 50."""
    return [step(1, 40.0, 40.0), step(2, None, 45.0), step(4, 12.34, 50.0, **cpu)]


def test_it_blames_the_cpu_with_every_word_of_the_finding():
    steps = stalled(node_cpu_pct=91.4, node_cpu_node="node-01", host_cpu_pct=88.6)
    assert findings(steps=steps, nodes=[node("node-01")]) == [
        {
            "rule": "cpu_saturated",
            "symptom": "one stream fast, many streams stall",
            "cause": "CPU saturated: the nodes had no CPU left (not memory bandwidth)",
            "evidence": f"{STALL}; at 4 sessions node-01 used 91 % of the CPUs it computes on "
            "and the host's CPUs were 89 % busy",
            "check": "the nodes' CPU % on the Utilization page against their threads and CPU "
            "sets, and the host's CPU (the control plane and the load generator share it on one "
            "machine)",
            "remedy": "more threads and CPUs per node (threads, cpu_set), fewer sessions per node "
            "(max_sessions), or more nodes; on one machine, give the control plane CPUs of its "
            "own",
            "severity": "warn",
        }
    ]


def test_it_counts_the_cpu_out_from_85_percent_of_node_or_host():
    node_at = findings(steps=stalled(node_cpu_pct=85.0, node_cpu_node="n"), nodes=[node("n")])
    assert node_at[0]["evidence"].endswith("; at 4 sessions n used 85 % of the CPUs it computes on")
    host_at = findings(steps=stalled(host_cpu_pct=85.0), nodes=[node("n")])
    assert host_at[0]["evidence"].endswith("; at 4 sessions the host's CPUs were 85 % busy")
    below = findings(steps=stalled(node_cpu_pct=84.9, host_cpu_pct=84.9), nodes=[node("n")])
    assert rules_of(below) == ["memory_bandwidth"]


def test_it_blames_memory_bandwidth_with_every_word_of_the_finding():
    steps = stalled(node_cpu_pct=None, host_cpu_pct=50.4)
    assert findings(steps=steps, nodes=[node("node-01")]) == [
        {
            "rule": "memory_bandwidth",
            "symptom": "one stream fast, many streams stall",
            "cause": "memory bandwidth saturated",
            "evidence": f"{STALL}; the CPU had room (busiest node 0 % of its CPUs, host 50 %)",
            "check": "the node's measured memory bandwidth on its Validation page against the "
            "machine's peak",
            "remedy": "fewer sessions per node (max_sessions), more nodes or more memory channels",
            "severity": "warn",
        }
    ]
    node_only = findings(steps=stalled(node_cpu_pct=60.6), nodes=[node("node-01")])
    assert node_only[0]["evidence"].endswith("(busiest node 61 % of its CPUs, host 0 %)")
    unmeasured = findings(steps=stalled(), nodes=[node("node-01")])
    assert unmeasured[0]["evidence"] == (
        f"{STALL}; the nodes' CPU was not measured, so CPU saturation is not ruled out"
    )


def test_it_calls_a_stall_only_under_half_the_stream_rate_and_a_quarter_of_the_growth():
    def stall(low, high):
        return rules_of(findings(steps=[step(*low), step(*high)], nodes=[node("a")]))

    assert stall((2, 40.0, 40.0), (4, 19.9, 49.9)) == ["memory_bandwidth"]
    assert stall((2, 40.0, 40.0), (4, 20.0, 40.0)) == []  # streams at exactly half
    assert stall((2, 40.0, 40.0), (4, 10.0, 50.0)) == []  # throughput grew by exactly a quarter
    assert stall((2, 40.0, 0.0), (4, 10.0, 10.0)) == []  # no throughput to compare with
    assert stall((1, 40.0, 40.0), (2, 10.0, 40.0)) == ["memory_bandwidth"]  # two streams a node


def test_it_needs_two_streams_a_node_that_answered_before_it_calls_a_stall():
    steps = [step(1, 40.0, 40.0), step(4, 10.0, 40.0)]
    two = [node("a"), node("b")]
    assert rules_of(findings(steps=steps, nodes=two)) == ["memory_bandwidth"]  # 4 on 2 nodes
    three = [node("a"), node("b"), node("c")]
    assert rules_of(findings(steps=steps, nodes=three)) == []  # 4 on 3 nodes: under two a node
    idle = [node("a"), node("b"), node("c", requests=0)]
    assert rules_of(findings(steps=steps, nodes=idle)) == ["memory_bandwidth"]
    assert rules_of(findings(steps=[step(1, 40.0, 40.0)], nodes=two)) == []


def calls(required, valid, truncated=0):
    validity = valid / required if required else None
    return {"required": required, "valid": valid, "truncated": truncated, "validity": validity}


def test_it_blames_quantization_and_the_token_limit_with_every_word():
    assert findings(tool_calls=calls(40, 30, truncated=4)) == [
        {
            "rule": "tool_calls",
            "symptom": "tool-call arguments sometimes wrong",
            "cause": "quantization too aggressive",
            "evidence": "30 of 40 required tool calls were valid against their schema (75%); "
            "4 of the others ended at the token limit",
            "check": "the package's tool-call accuracy, Q4_K_M against Q8_0 (Packages: evaluate)",
            "remedy": "serve a higher quantization type (build and evaluate it, then roll it out)",
            "severity": "warn",
        },
        {
            "rule": "tool_calls_truncated",
            "symptom": "tool calls cut off",
            "cause": "the token limit: tool_max_tokens too small, or the model rambling inside an "
            "argument",
            "evidence": "4 of 40 required tool calls hit the token limit before the call was "
            "complete",
            "check": "the turns' completion tokens against tool_max_tokens (CSV export, every turn)",
            "remedy": "raise tool_max_tokens if the calls are long; a model that rambles needs a "
            "higher quantization type or a larger model",
            "severity": "info",
        },
    ]


def test_it_judges_tool_calls_from_ten_checked_under_95_percent_valid():
    evidence = findings(tool_calls=calls(10, 9))[0]["evidence"]
    assert evidence == "9 of 10 required tool calls were valid against their schema (90%)"
    assert findings(tool_calls=calls(9, 0)) == []
    assert findings(tool_calls=calls(20, 19)) == []  # exactly 95 %
    assert rules_of(findings(tool_calls=calls(10_000, 9_499))) == ["tool_calls"]
    assert findings(tool_calls={**calls(0, 0), "required": 12}) == []  # validity unknown
    cut_only = findings(tool_calls=calls(5, 5, truncated=1))
    assert rules_of(cut_only) == ["tool_calls_truncated"]


def test_it_names_the_session_that_moved_with_every_word():
    sessions = [
        {"sid": "s0", "nodes": ["a"]},
        {"sid": "s1", "nodes": ["a", "b", "a"]},
        {"sid": "s2", "nodes": ["b", "c"]},
    ]
    assert findings(sessions=sessions) == [
        {
            "rule": "session_moved",
            "symptom": "a session slows mid-conversation",
            "cause": "the scheduler moved it (stickiness broken)",
            "evidence": "2 of 3 sessions were answered by more than one node, e.g. s1: a -> b -> a",
            "check": "the session's decision log (GET /api/sessions/<id>) and the node events",
            "remedy": "failover_strategy stick_and_redirect, a longer session_idle_release_s, "
            "fix the node that went down or drained",
            "severity": "warn",
        }
    ]


def placement(*nodes):
    found = findings(nodes=list(nodes))
    return found[0]["evidence"] if found else None


def test_it_blames_placement_with_every_word():
    found = findings(nodes=[node("a", 40, share=0.8), node("b", 10, share=0.2)])
    assert found == [
        {
            "rule": "placement",
            "symptom": "one node saturated while others idle",
            "cause": "placement: new sessions are not spread",
            "evidence": "a answered 80% of requests (fair share 50%)",
            "check": "the nodes' weights and max_sessions, the routing decision log",
            "remedy": "equal weights for equal nodes, or stick_and_rebalance for long sessions",
            "severity": "warn",
        }
    ]


def test_it_calls_placement_past_one_and_a_half_fair_shares_of_ten_requests():
    assert placement(node("a", 30, share=0.75), node("b", 10, share=0.25)) is None  # 1.5 x
    assert placement(node("a", 8, share=0.89), node("b", 1, share=0.11)) is None  # 9 requests
    three = [node("a", 6, share=0.6), node("b", 2, share=0.2), node("c", 2, share=0.2)]
    assert placement(*three) == "a answered 60% of requests (fair share 33%)"
    idle = node("d", 0, share=0.0)
    assert placement(node("a", 9, share=0.9), node("b", 1, share=0.1), idle) == (
        "a answered 90% of requests (fair share 50%)"  # d answered nothing and ran nothing
    )
    assert placement(node("a", 10, share=1.0)) is None  # one node: nothing to spread


def test_it_calls_placement_on_a_cpu_gap_of_40_points():
    hot, cold = node("hot", cpu=70.0, share=0.5), node("cold", cpu=30.0, share=0.5)
    assert placement(hot, cold) == "hot averaged 70 % CPU while cold averaged 30 %"
    assert placement(hot, node("cold", cpu=30.5, share=0.5)) is None
    assert placement(node("a", 0, cpu=80.0, share=0.0), node("b", 0, cpu=20.0, share=0.0)) == (
        "a averaged 80 % CPU while b averaged 20 %"  # nodes that answered nothing but ran
    )
    assert placement(hot, node("unknown", share=0.5)) is None


def queueing(queue_ms, ttft=0.4, cpus=(30.2, 40.4)):
    nodes = [node(f"n{i}", cpu=cpu) for i, cpu in enumerate(cpus)]
    """Findings of a run whose TTFT P95 is ``ttft`` (18 turns under it, one over it)."""
    turns = [turn(0, 1, ttft=ttft - 0.1) for _ in range(18)]
    turns += [turn(0, 1, ttft=ttft), turn(0, 1, ttft=ttft + 0.05)]
    turns += [turn(0, 1, ok=False, ttft=9.0)] * 3 + [turn(0, 1, ttft=None), turn(0, 1, ttft=0.0)]
    return findings(turns=turns, nodes=nodes, ttft_split={"queue_p95_ms": queue_ms})


def test_it_blames_batching_for_queueing_with_every_word():
    assert queueing(200.4, ttft=0.6) == [
        {
            "rule": "queueing",
            "symptom": "requests queue while the CPU is idle",
            "cause": "batching settings: too few sequences per node",
            "evidence": "queue wait P95 200 ms of a TTFT P95 600 ms, nodes' mean CPU 35 %",
            "check": "the nodes' queue depth and active sequences during the run (Utilization "
            "page)",
            "remedy": "more sequences per node (an upgrade with node_settings sequences), or "
            "more nodes",
            "severity": "warn",
        }
    ]


def test_it_calls_queueing_past_50_ms_a_quarter_of_ttft_and_under_70_percent_cpu():
    assert queueing(50.0, ttft=0.1) == [] and rules_of(queueing(50.5, ttft=0.1)) == ["queueing"]
    assert queueing(100.0) == [] and rules_of(queueing(100.1)) == ["queueing"]
    assert queueing(200.0, cpus=(70.0, 70.0)) == []
    assert rules_of(queueing(200.0, cpus=(69.8, 70.0))) == ["queueing"]
    assert rules_of(queueing(200.0, cpus=(60.0, None))) == ["queueing"]  # n1 not measured
    assert queueing(200.0, cpus=(None, None)) == []
    assert queueing(None) == []
    assert findings(nodes=[node("n", cpu=10.0)], ttft_split={"queue_p95_ms": 200.0}) == []


def cold(*firsts, median=0.1):
    """Findings of a run whose nodes' first turns had ``firsts`` TTFTs, later hits ``median``."""
    turns = [turn(0, 1, node="a", ttft=median + (k - 9) / 1000, t=5.0 + k) for k in range(20)]
    turns += [turn(0, 1, node="a", ttft=4.0, hit=False, t=9.0)] * 9  # misses: not the median
    turns += [turn(0, 1, node="a", ttft=0.0, t=9.0)] * 3  # no first token: not the median
    turns += [turn(0, 1, node=n, ttft=ttft, hit=False, t=1.0) for n, ttft in firsts]
    turns += [
        turn(0, 1, ok=False, node="z", ttft=9.0, t=0.0),
        turn(0, 1, node="", ttft=9.0, hit=False),
    ]
    turns.append(turn(0, 1, node="y", ttft=None, t=0.0))
    return findings(turns=turns)


def test_it_names_the_slowest_cold_start_with_every_word():
    assert cold(("b", 2.5), ("c", 3.25), ("d", 0.3)) == [
        {
            "rule": "cold_start",
            "symptom": "the first request after a restart is slow",
            "cause": "cold model load",
            "evidence": "c's first turn waited 3.25 s for its first token against a cache-hit "
            "median of 0.100 s",
            "check": "the node's cold-start time (its restart events and first TTFT)",
            "remedy": "warm the node up (a canary after start) and keep the process resident",
            "severity": "warn",
        }
    ]


def test_it_calls_a_cold_start_past_half_a_second_and_three_medians():
    assert cold(("b", 0.5)) == [] and rules_of(cold(("b", 0.51))) == ["cold_start"]
    assert cold(("b", 0.75), median=0.25) == []
    assert rules_of(cold(("b", 0.76), median=0.25)) == ["cold_start"]
    late = [turn(0, 1, node="a", ttft=0.1, t=1.0), turn(0, 1, node="a", ttft=2.0, t=2.0)]
    assert findings(turns=late[::-1]) == []  # a's first turn was its fast one
    assert findings(turns=[turn(0, 1, ttft=2.0, hit=False)]) == []  # no cache hit to judge by


def test_it_counts_refusals_and_a_slow_or_failing_control_plane_with_every_word():
    errors = [
        {"kind": "http_429 array_full", "count": 3},
        {"kind": "timeout", "count": 5},
        {"kind": "http_503 draining", "count": 1},
    ]
    plane = {
        "console": {"p95_ms": 1500.4, "failed": 0},
        "health": {"p95_ms": 1000.0, "failed": 2},
        "proxy": {"p95_ms": None},
    }
    assert findings(errors=errors, control_plane=plane) == [
        {
            "rule": "overload",
            "symptom": "requests refused with 429/503",
            "cause": "the array is full at this concurrency",
            "evidence": "4 requests refused: http_429 array_full x3, http_503 draining x1",
            "check": "the nodes' max_sessions, KV budget and the policy's max_inflight",
            "remedy": "plan capacity from the knee (add nodes), or raise the limits if the nodes "
            "have room",
            "severity": "warn",
        },
        {
            "rule": "control_plane",
            "symptom": "the console answers slowly under load",
            "cause": "the control plane shares CPUs with the nodes",
            "evidence": "console P95 1500 ms; health 2 failed",
            "check": "a flame graph of the control plane during the run (profile: true)",
            "remedy": "pin the nodes to their own CPUs (Node.cpu_set), or run the control plane "
            "on another host",
            "severity": "warn",
        },
    ]
    assert findings(errors=errors[1:2], control_plane={"health": {"p95_ms": 1000.0}}) == []
    slow = findings(control_plane={"health": {"p95_ms": 1000.7}})
    assert slow[0]["evidence"] == "health P95 1001 ms"

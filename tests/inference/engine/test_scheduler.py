"""The continuous-batching engine with the real bundled model (SmolLM2-135M-Instruct Q4_1)."""

from __future__ import annotations

import time

import pytest

from inference.engine.request import PromptTooLong, QueueFull
from tests.inference.engine.conftest import EngineDriver, make_engine, user

pytestmark = pytest.mark.model

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Say hello in Spanish.",
]


def test_it_keeps_concurrent_streams_apart(driver: EngineDriver) -> None:
    # llama.cpp's kernels may round differently at other batch sizes, so a run is compared with
    # a run of the same batch composition, not with a solo run.
    def batch() -> list[str]:
        driver.engine.clear_cache().result(10)  # same composition: no prefix left from before
        runs = [driver.prepare(user(p), max_tokens=32) for p in PROMPTS]
        driver.engine.submit_all([r.request for r in runs])
        return [r.wait()[1].text for r in runs]

    first, second = batch(), batch()
    assert first == second
    assert len(set(first)) == len(PROMPTS)
    # Each answer is about its own prompt, not a neighbour's.
    assert "Hola" in first[3] and "Hola" not in "".join(first[:3])
    assert any(ch.isdigit() for ch in first[2])


def test_it_streams_exactly_the_final_text(driver: EngineDriver) -> None:
    run = driver.submit(
        user("Reply with three emoji and the Japanese word for cat."),
        temperature=0.9,
        seed=7,
        max_tokens=40,
    )
    deltas, done = run.wait()
    assert "".join(deltas) == done.text
    assert "\ufffd" not in done.text
    again = driver.chat(
        user("Reply with three emoji and the Japanese word for cat."),
        temperature=0.9,
        seed=7,
        max_tokens=40,
    )
    assert again.text == done.text


def test_it_reuses_the_session_prefix_on_the_next_turn(driver: EngineDriver) -> None:
    driver.engine.clear_cache().result(10)
    history = user("Name a colour of the rainbow.")
    first = driver.chat(history, session="reuse-1")
    assert first.cached_tokens == 0
    history += [{"role": "assistant", "content": first.text}, *user("And another one?")]
    second = driver.chat(history, session="reuse-1")
    first_prompt = len(driver.tokens(history[:1]))
    assert second.cached_tokens >= first_prompt
    assert second.prompt_tokens - second.cached_tokens < second.prompt_tokens / 2


def test_it_stops_at_a_stop_string_without_emitting_it(driver: EngineDriver) -> None:
    free = driver.chat(user("Count from 1 to 10, separated by commas."), max_tokens=40)
    assert "4" in free.text
    stop = driver.submit(
        user("Count from 1 to 10, separated by commas."), max_tokens=40, stop=("4",)
    )
    deltas, done = stop.wait()
    assert done.finish_reason == "stop"
    assert "4" not in done.text and "".join(deltas) == done.text
    assert free.text.startswith(done.text)


def test_it_repeats_text_for_the_same_seed(driver: EngineDriver) -> None:
    kw = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "max_tokens": 24}
    a = driver.chat(user("Tell me a story."), seed=1234, **kw)
    b = driver.chat(user("Tell me a story."), seed=1234, **kw)
    c = driver.chat(user("Tell me a story."), seed=99, **kw)
    assert a.text == b.text
    assert a.text != c.text


def test_it_refuses_a_prompt_that_does_not_fit(driver: EngineDriver) -> None:
    with pytest.raises(PromptTooLong, match="per-sequence context of 1024"):
        driver.submit(user("word " * 1100))
    with pytest.raises(PromptTooLong):
        driver.submit(user("hello"), max_tokens=1020)


def test_it_cancels_within_a_step_and_frees_the_sequence(driver: EngineDriver) -> None:
    # Greedy counting runs to max_tokens, so only the cancel can end it early.
    run = driver.submit(user("Count from 1 to 1000, separated by commas."), max_tokens=500)
    first = run.events.get(timeout=60)
    assert first.text
    before = driver.engine.snapshot()
    driver.engine.cancel(run.request)
    deltas, done = run.wait(timeout=5)
    after = driver.engine.snapshot()
    assert done.finish_reason == "cancelled"
    assert after["cancelled_total"] == before["cancelled_total"] + 1
    # the cancel lands within the step in flight: a few tokens more at most, not hundreds
    assert after["generated_tokens_total"] - before["generated_tokens_total"] <= 4
    assert driver.engine.active_count == 0
    assert not any(s["state"] == "active" for s in driver.engine.slots())


def test_it_round_trips_idle_kv_through_host_ram() -> None:
    engine = make_engine(sequences=2, host_ram_mib=32)
    try:
        d = EngineDriver(engine)

        def two_turns(session: str, between=lambda: None) -> str:
            history = user("What is the largest planet?")
            answer = d.chat(history, session=session)
            between()
            history += [{"role": "assistant", "content": answer.text}, *user("How big is it?")]
            second = d.chat(history, session=session)
            assert second.cached_tokens > 0
            return second.text

        def crowd_out() -> None:
            d.chat(user("Unrelated question one."), session="other-1")
            d.chat(user("Unrelated question two."), session="other-2")
            assert d.engine.table.locate("spilled", 1)["where"] == "host"

        restored = two_turns("spilled", between=crowd_out)
        assert engine.stats.restored_from_host_total == 1
        engine.clear_cache().result(10)  # "resident" computes its first turn from scratch too
        assert restored == two_turns("resident")
        assert engine.stats.restored_from_host_total == 1
    finally:
        engine.stop()


def test_sessions_spilled_to_host_keep_their_system_prompt_once() -> None:
    system = {"role": "system", "content": "You are a terse agent. Tools: " + "lookup, " * 40}

    def first(text: str) -> list[dict]:
        return [system, *user(text)]

    engine = make_engine(sequences=1, host_ram_mib=32)
    try:
        d = EngineDriver(engine)
        answer = d.chat(first("Name a planet."), session="a").text
        d.chat(first("Name a river."), session="b")
        d.chat(first("Name a city."), session="c")  # a and b are in host RAM now
        snap = engine.snapshot()
        assert snap["host_prefixes"] == 1 and snap["sequences_host"] == 2
        assert snap["host_ram_shared_saved_bytes"] > 0
        history = first("Name a planet.") + [{"role": "assistant", "content": answer}]
        history += user("Another one?")
        restored = d.chat(history, session="a")
        assert engine.stats.restored_from_host_total == 1
        assert restored.cached_tokens >= len(d.tokens([system]))
        engine.clear_cache().result(10)
        d.chat(first("Name a planet."), session="fresh")
        assert restored.text == d.chat(history, session="fresh").text
    finally:
        engine.stop()


def test_it_drops_past_the_host_budget_and_prefills_again() -> None:
    engine = make_engine(sequences=1, host_ram_mib=0)
    try:
        d = EngineDriver(engine)
        d.chat(user("First session."), session="a")
        d.chat(user("Second session."), session="b")
        again = d.chat(user("First session."), session="a")
        assert again.cached_tokens == 0
        assert engine.snapshot()["sequences_host"] == 0
    finally:
        engine.stop()


def until(predicate, timeout: float = 30.0) -> None:
    """Wait for a state (not for a time: the suite runs on two busy cores)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the state never came"
        time.sleep(0.01)


def test_it_answers_queue_full_past_its_bound() -> None:
    engine = make_engine(sequences=1, max_queue=1)
    try:
        d = EngineDriver(engine)
        runs = [d.submit(user("Write a long poem."), max_tokens=64)]
        until(lambda: engine.snapshot()["sequences_active"] == 1)  # admitted and running
        runs.append(d.submit(user("Write a long poem."), max_tokens=64))
        with pytest.raises(QueueFull):
            d.submit(user("One more."), max_tokens=8)
        for r in runs:
            r.wait()
    finally:
        engine.stop()


def test_it_shares_a_common_system_prompt_across_sessions(driver: EngineDriver) -> None:
    driver.engine.clear_cache().result(10)
    system = {"role": "system", "content": "You are a careful agent. " * 30}
    first = driver.chat([system, *user("Plan a trip to Rome.")], session="share-a")
    second = driver.chat([system, *user("Plan a trip to Oslo.")], session="share-b")
    system_tokens = len(driver.tokens([system]))
    assert first.cached_tokens == 0
    assert second.cached_tokens >= system_tokens - 8  # the template's turn opener may differ
    # Both sessions keep their own sequence, and the first session's next turn still reuses.
    third = driver.chat(
        [
            system,
            *user("Plan a trip to Rome."),
            {"role": "assistant", "content": first.text},
            *user("And the budget?"),
        ],
        session="share-a",
    )
    assert third.cached_tokens > first.prompt_tokens - 2


def test_it_prefills_a_system_prompt_once_for_sessions_that_arrive_together(
    driver: EngineDriver,
) -> None:
    driver.engine.clear_cache().result(10)
    system = {"role": "system", "content": "You are an agent with many tools. " * 30}
    runs = [
        driver.prepare([system, *user(f"Task number {i}.")], session=f"together-{i}")
        for i in range(3)
    ]
    driver.engine.submit_all([r.request for r in runs])
    results = [r.wait()[1] for r in runs]
    system_tokens = len(driver.tokens([system]))
    assert sorted(r.cached_tokens >= system_tokens - 8 for r in results) == [False, True, True]


def test_it_shares_prefixes_in_a_unified_kv_cache_too() -> None:
    engine = make_engine(sequences=2, kv_unified=True)
    try:
        d = EngineDriver(engine)
        system = {"role": "system", "content": "You are a careful agent. " * 30}
        first = d.chat([system, *user("Plan a trip to Rome.")], session="u-a")
        second = d.chat([system, *user("Plan a trip to Oslo.")], session="u-b")
        assert first.cached_tokens == 0
        assert second.cached_tokens >= len(d.tokens([system])) - 8
        history = [
            system,
            *user("Plan a trip to Rome."),
            {"role": "assistant", "content": first.text},
        ]
        third = d.chat([*history, *user("Budget?")], session="u-a")
        assert third.cached_tokens > first.prompt_tokens - 2
    finally:
        engine.stop()


def test_the_timings_split_the_time_to_first_token() -> None:
    engine = make_engine(sequences=1, host_ram_mib=32)
    try:
        d = EngineDriver(engine)
        first = user("What is the largest planet?")
        d.chat(first, session="split-a")
        d.chat(user("Unrelated question."), session="split-b")  # split-a goes to host RAM
        back = d.chat(
            [*first, {"role": "assistant", "content": "Jupiter."}, *user("Why?")], session="split-a"
        )
        t = back.timings
        assert engine.stats.restored_from_host_total == 1
        assert t["kv_swap_ms"] > 0  # split-b copied out, split-a copied back in
        assert t["queue_ms"] >= t["kv_swap_ms"]
        assert t["ttft_ms"] == pytest.approx(t["queue_ms"] + t["prefill_ms"], abs=0.05)
        assert t["prefill_ms"] > 0
    finally:
        engine.stop()


def test_concurrent_requests_share_the_node_seconds_of_the_steps_they_shared(
    driver: EngineDriver,
) -> None:
    """Each request's node time (``prefill_node_ms``, ``decode_node_ms``: what usage
    accounting prices) is its share of the steps it was in, so the node-seconds of requests
    decoded together add up to no more than the time the engine spent on them."""
    started = time.perf_counter()
    runs = [
        driver.submit(user(f"Count from one to twenty, variant {i}."), max_tokens=24)
        for i in range(3)
    ]
    done = [run.wait()[1] for run in runs]
    span_ms = (time.perf_counter() - started) * 1000
    for finished in done:
        t = finished.timings
        assert t["prefill_node_ms"] > 0 and t["decode_node_ms"] > 0
        assert t["prefill_node_ms"] <= t["prefill_ms"] + 0.5
        assert t["decode_node_ms"] <= t["total_ms"] - t["ttft_ms"] + 0.5
    shared = sum(f.timings["prefill_node_ms"] + f.timings["decode_node_ms"] for f in done)
    assert shared <= span_ms


def test_a_steps_time_splits_into_llama_cpp_and_the_rest(driver):
    """The Python share of a decode step: what /metrics gives (step seconds, and of those the
    seconds inside llama.cpp's decode and sampling)."""
    before = driver.engine.snapshot()
    driver.chat(user("Write a short poem about rivers."), max_tokens=16)
    after = driver.engine.snapshot()
    step = after["step_seconds_total"] - before["step_seconds_total"]
    in_llama = after["step_llama_seconds_total"] - before["step_llama_seconds_total"]
    assert 0 < in_llama < step
    assert in_llama / step > 0.5  # a 135M model's step is mostly matrix work, not Python


def test_a_step_puts_its_sequences_into_the_batch_in_id_order() -> None:
    """With one KV stream per sequence llama.cpp computes a batch in ubatches of sequences
    whose ids follow each other in batch order, so sessions admitted in another order than
    their sequences' ids must still go into the batch by id, or a step of four sequences is
    several passes over the weights."""
    engine = make_engine(sequences=4, ctx_per_seq=512, kv_unified=False)
    driver = EngineDriver(engine)
    try:
        turns = {s: user(f"Session {s}: name a colour.") for s in "abcd"}
        for session, messages in turns.items():  # a, b, c, d in sequences 0, 1, 2, 3
            driver.chat(messages, session=session, max_tokens=4)
        held = {slot["session_id"]: slot["id"] for slot in engine.slots()}
        seen: list[list[int]] = []
        decode = engine.ctx.decode

        def recording() -> None:
            raw = engine.ctx.batch.raw
            seen.append([raw.seq_id[i][0] for i in range(raw.n_tokens)])
            decode()

        engine.ctx.decode = recording
        later = [
            driver.prepare([*turns[s], {"role": "user", "content": "Another?"}], session=s)
            for s in sorted(held, key=held.get, reverse=True)  # admitted d, c, b, a
        ]
        engine.submit_all([run.request for run in later])
        assert all(run.wait()[1].text for run in later)
        assert len(seen) > 4 and sorted(held.values()) == [0, 1, 2, 3]
        assert all(ids == sorted(ids) for ids in seen), seen[:3]
        assert any(len(set(ids)) == 4 for ids in seen)  # steps that held all four
    finally:
        engine.stop()

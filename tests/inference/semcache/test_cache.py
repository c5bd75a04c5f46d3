"""The semantic cache over both stores: the embedded SQLite file and Redis pass the same tests
(the real encoder, the real usearch index, the real Redis on loopback)."""

from __future__ import annotations

import secrets
import time

import pytest
from django.conf import settings

from inference.semcache.cache import Hit, Miss, Rules, SemanticCache, tool_text
from inference.semcache.encoder import DIMENSIONS, shared_encoder
from inference.semcache.precision import labelled_pairs
from inference.semcache.redis_store import RedisStore
from inference.semcache.store import Entry, SqliteStore

RULES = Rules(threshold=0.75, ttl_s=3600.0, max_entries=1000)


@pytest.fixture(scope="module")
def encoder():
    return shared_encoder(settings.MODEL_DIR / "embeddings")


@pytest.fixture(params=["sqlite", "redis"])
def store(request, tmp_path):
    if request.param == "sqlite":
        yield SqliteStore(tmp_path / "semcache.sqlite3")
        return
    prefix = f"phalanx-test:{secrets.token_hex(4)}:"
    redis_store = RedisStore("redis://127.0.0.1:6379/0", prefix=prefix)
    yield redis_store
    keys = list(redis_store.redis.scan_iter(f"{prefix}*"))
    if keys:
        redis_store.redis.delete(*keys)


@pytest.fixture
def cache(store, encoder):
    return SemanticCache(store, encoder.embed, DIMENSIONS)


def put(cache, namespace, text, value, rules=RULES, partition=""):
    entry = Entry(namespace, partition, "", text, value, 0.0, 0.0, tokens=40, seconds=0.5)
    return cache.put(entry, rules)


def test_a_paraphrase_hits_and_says_how_similar(cache) -> None:
    put(cache, "answers:m", "What's the weather in Paris tomorrow?", '"sunny"')
    found = cache.lookup("answers:m", "", "Tomorrow's weather forecast for Paris?", RULES)
    assert isinstance(found, Hit) and not found.exact
    assert found.entry.value == '"sunny"' and 0.75 <= found.similarity < 1.0
    assert found.age_s() < 5


def test_the_same_text_hits_exactly_whatever_its_spacing(cache) -> None:
    put(cache, "tools:get_weather", tool_text("get_weather", {"city": "Paris", "days": 2}), "{}")
    again = tool_text("get_weather", {"days": 2, "city": "Paris"})  # keys in another order
    found = cache.lookup("tools:get_weather", "", "  " + again.replace(" ", "  "), RULES)
    assert isinstance(found, Hit) and found.exact and found.similarity == 1.0


def test_every_near_miss_of_the_labelled_set_misses(cache) -> None:
    near_misses = [p for p in labelled_pairs() if not p.same]
    assert len(near_misses) > 100
    for pair in near_misses:
        put(cache, f"{pair.namespace}:x", pair.a, "cached")
    served = [
        (pair.a, pair.b)
        for pair in near_misses
        if isinstance(cache.lookup(f"{pair.namespace}:x", "", pair.b, RULES), Hit)
    ]
    assert served == []


def test_the_second_check_refuses_a_reversal_the_threshold_lets_through(cache) -> None:
    put(cache, "answers:m", "Turn on the kitchen lights", "done")
    found = cache.lookup("answers:m", "", "Turn off the kitchen lights", RULES)
    assert isinstance(found, Miss) and "opposites" in found.reason
    assert found.best_similarity > RULES.threshold
    assert cache.store.counters()["answers:m"]["refused_by_check"] == 1


def test_partitions_and_namespaces_never_meet(cache) -> None:
    put(cache, "answers:m", "What is the capital of France?", "Paris", partition="p1")
    assert isinstance(
        cache.lookup("answers:m", "p2", "What is the capital of France?", RULES), Miss
    )
    assert isinstance(
        cache.lookup("answers:n", "p1", "What is the capital of France?", RULES), Miss
    )
    assert isinstance(cache.lookup("answers:m", "p1", "What is the capital of France?", RULES), Hit)


def test_an_expired_entry_is_not_served(cache) -> None:
    put(cache, "answers:m", "How tall is Mount Everest?", "8849 m", Rules(0.75, 0.2, 100))
    time.sleep(0.3)
    assert isinstance(cache.lookup("answers:m", "", "How tall is Mount Everest?", RULES), Miss)
    assert isinstance(cache.lookup("answers:m", "", "How high is Mount Everest?", RULES), Miss)


def test_invalidation_by_namespace_prefix_and_age(cache) -> None:
    put(cache, "tools:search", tool_text("search", {"q": "rome flights"}), "[]")
    put(cache, "tools:weather", tool_text("weather", {"city": "Rome"}), "{}")
    put(cache, "answers:m", "Who wrote Hamlet?", "Shakespeare")
    assert cache.invalidate("tools:", older_than_s=3600) == 0  # none that old
    assert cache.invalidate("tools:search") == 1
    assert isinstance(
        cache.lookup("tools:search", "", tool_text("search", {"q": "rome flights"}), RULES), Miss
    )
    assert isinstance(
        cache.lookup("tools:weather", "", tool_text("weather", {"city": "Rome"}), RULES), Hit
    )
    assert cache.invalidate("") == 2
    assert isinstance(cache.lookup("answers:m", "", "Who wrote Hamlet?", RULES), Miss)
    assert cache.store.sizes() == {}


def test_an_index_in_another_process_sees_removals(store, encoder) -> None:
    here, there = (SemanticCache(store, encoder.embed, DIMENSIONS) for _ in range(2))
    put(here, "answers:m", "What's the population of Tokyo?", "14 million")
    question = "How many people live in Tokyo?"
    assert isinstance(there.lookup("answers:m", "", question, RULES), Hit)
    here.invalidate("answers:")
    assert isinstance(there.lookup("answers:m", "", question, RULES), Miss)
    put(here, "answers:m", "What's the population of Tokyo?", "14.1 million")
    found = there.lookup("answers:m", "", question, RULES)
    assert isinstance(found, Hit) and found.entry.value == "14.1 million"


def test_the_oldest_entries_go_past_the_size_bound(cache) -> None:
    small = Rules(0.75, 3600.0, 10)
    for n in range(12):
        put(cache, "tools:t", tool_text("t", {"n": n}), str(n), small)
    held = cache.store.sizes()["tools:t"]
    assert held <= 10
    assert isinstance(cache.lookup("tools:t", "", tool_text("t", {"n": 0}), small), Miss)
    assert isinstance(cache.lookup("tools:t", "", tool_text("t", {"n": 11}), small), Hit)


def test_counters_add_up_hits_savings_and_false_hit_reports(cache) -> None:
    entry = put(cache, "answers:m", "Who painted the Mona Lisa?", "Leonardo")
    cache.lookup("answers:m", "", "Who painted the Mona Lisa?", RULES)
    cache.lookup("answers:m", "", "Which artist painted the Mona Lisa?", RULES)
    cache.lookup("answers:m", "", "What is the boiling point of water?", RULES)
    cache.report_false_hit(entry.id, "Which artist painted the Mona Lisa?", 0.9, "wrong era")
    counts = cache.store.counters()["answers:m"]
    assert (counts["lookups"], counts["hits"], counts["exact_hits"]) == (3, 2, 1)
    assert counts["tokens_saved"] == 80 and counts["seconds_saved"] == 1.0
    assert counts["false_hits"] == 1 and counts["stores"] == 1
    [report] = cache.store.reports(10)
    assert report.cached_text == "Who painted the Mona Lisa?" and report.note == "wrong era"
    assert isinstance(cache.lookup("answers:m", "", "Who painted the Mona Lisa?", RULES), Miss)
    with pytest.raises(KeyError):
        cache.report_false_hit(entry.id, "again", 0.9, "")


def test_a_sweep_removes_what_expired(cache) -> None:
    put(cache, "answers:m", "How far is the Moon?", "384,400 km", Rules(0.75, 0.1, 100))
    put(cache, "answers:m", "How far is the Sun?", "150 million km")
    time.sleep(0.2)
    assert cache.store.sweep(time.time()) == 1
    assert cache.store.sizes() == {"answers:m": 1}


def test_a_package_change_of_one_model_keeps_another_models_answers(cache) -> None:
    put(cache, "answers:m", "Who wrote Hamlet?", "Shakespeare")
    put(cache, "answers:m-large", "Who wrote Hamlet?", "William Shakespeare")
    assert cache.invalidate("answers:m", exact=True) == 1
    assert isinstance(cache.lookup("answers:m-large", "", "Who wrote Hamlet?", RULES), Hit)


def test_a_lookup_the_check_refused_counts_once_however_many_candidates(cache) -> None:
    put(cache, "answers:m", "What's the weather in Paris today?", "sunny")
    put(cache, "answers:m", "How is the weather in Paris today?", "sunny")
    found = cache.lookup("answers:m", "", "What's the weather in London today?", RULES)
    assert isinstance(found, Miss)
    assert cache.store.counters()["answers:m"]["refused_by_check"] == 1

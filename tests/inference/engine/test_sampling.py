"""The sampler chain a request's settings build (pure: no model loaded)."""

from __future__ import annotations

import pytest

from inference.engine.sampling import SamplingParams, sampler_plan


def names(**settings) -> list[str]:
    return [name for name, _ in sampler_plan(SamplingParams(seed=7, **settings))]


def test_the_defaults_truncate_then_sample_with_the_seed() -> None:
    plan = sampler_plan(SamplingParams(seed=7))
    assert plan == [
        ("top_k", (40,)),
        ("top_p", (0.95, 1)),
        ("min_p", (0.05, 1)),
        ("temp", (0.8,)),
        ("dist", (7,)),
    ]


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_zero_or_negative_temperature_is_greedy_and_ignores_truncation(temperature) -> None:
    assert names(temperature=temperature, top_k=5, top_p=0.5, min_p=0.2) == ["greedy"]


def test_a_small_positive_temperature_still_samples() -> None:
    assert names(temperature=0.01)[-2:] == ["temp", "dist"]


def test_neutral_truncation_settings_add_no_stage() -> None:
    assert names(top_k=0, top_p=1.0, min_p=0.0) == ["temp", "dist"]
    assert names(top_k=1, top_p=0.99, min_p=0.01) == ["top_k", "top_p", "min_p", "temp", "dist"]


@pytest.mark.parametrize(
    "settings",
    [{"repeat_penalty": 1.1}, {"frequency_penalty": 0.5}, {"presence_penalty": -0.5}],
)
def test_any_penalty_adds_the_penalties_stage_with_every_setting(settings) -> None:
    plan = sampler_plan(SamplingParams(seed=1, repeat_last_n=32, temperature=0, **settings))
    expected = {"repeat_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}
    expected.update(settings)
    args = (
        32,
        expected["repeat_penalty"],
        expected["frequency_penalty"],
        expected["presence_penalty"],
    )
    assert plan == [("penalties", args), ("greedy", ())]


def test_no_penalty_adds_no_stage() -> None:
    assert "penalties" not in names(repeat_penalty=1.0, frequency_penalty=0, presence_penalty=0)


def test_the_grammar_comes_first() -> None:
    plan = sampler_plan(SamplingParams(seed=1, grammar='root ::= "x"', repeat_penalty=1.2))
    assert plan[0] == ("grammar", ('root ::= "x"',)) and plan[1][0] == "penalties"


def test_the_seed_is_cut_to_32_bits() -> None:
    assert sampler_plan(SamplingParams(seed=(1 << 32) + 5))[-1] == ("dist", (5,))
    assert sampler_plan(SamplingParams(seed=0xFFFFFFFF))[-1] == ("dist", (0xFFFFFFFF,))


@pytest.fixture(scope="module")
def model():
    from inference.engine.llama import LlamaModel
    from tests.support.processes import bundled_model_path

    loaded = LlamaModel(str(bundled_model_path()))
    yield loaded
    loaded.close()


def chain_names(sampler) -> list[str]:
    import llama_cpp as C

    return [
        C.llama_sampler_name(C.llama_sampler_chain_get(sampler.ptr, i)).decode()
        for i in range(C.llama_sampler_chain_n(sampler.ptr))
    ]


@pytest.mark.model
@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, ["top-k", "top-p", "min-p", "temp", "dist"]),
        ({"temperature": 0, "repeat_penalty": 1.2}, ["penalties", "greedy"]),
        ({"grammar": 'root ::= "yes" | "no"', "temperature": 0}, ["grammar", "greedy"]),
    ],
)
def test_llama_cpp_builds_the_planned_chain(model, settings, expected) -> None:
    from inference.engine.sampling import Sampler

    sampler = Sampler(model, SamplingParams(seed=3, **settings))
    try:
        assert chain_names(sampler) == expected
    finally:
        sampler.close()
    assert sampler.ptr is None
    sampler.close()  # twice is harmless


@pytest.mark.model
def test_a_grammar_llama_cpp_refuses_is_an_error_and_frees_the_chain(model) -> None:
    from inference.engine.llama import LlamaError
    from inference.engine.sampling import Sampler

    with pytest.raises(LlamaError) as caught:
        Sampler(model, SamplingParams(grammar="root ::= undefined_rule"))
    assert str(caught.value) == "llama.cpp rejected the grammar"


@pytest.mark.model
def test_the_grammar_stage_constrains_what_is_sampled(model) -> None:
    """Every token is equally likely; the grammar must leave only a start of "yes" or "no"."""
    import ctypes

    import llama_cpp as C

    from inference.engine.sampling import Sampler

    sampler = Sampler(model, SamplingParams(grammar='root ::= "yes" | "no"', temperature=0))
    try:
        data = (C.llama_token_data * model.n_vocab)()
        for i in range(model.n_vocab):
            data[i].id, data[i].logit, data[i].p = i, 0.0, 0.0
        candidates = C.llama_token_data_array(
            data=data, size=model.n_vocab, selected=-1, sorted=False
        )
        C.llama_sampler_apply(sampler.ptr, ctypes.byref(candidates))
        piece = model.token_text(data[candidates.selected].id)
    finally:
        sampler.close()
    assert piece and ("yes".startswith(piece) or "no".startswith(piece)), piece

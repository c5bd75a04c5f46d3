"""The node's own check of a switch request (``SwitchRequest.from_body``), as plain data: its
engine settings are bounded as an upgrade's node settings are (one definition,
``nodes.agent.engine_settings.LIMITS``), so a direct ``PUT /package`` is capped too. Through
a real node: tests/nodes/agent/test_switch.py."""

from __future__ import annotations

import pytest

from inference.upgrades import plan
from nodes.agent.engine_settings import LIMITS
from nodes.agent.switch import SwitchRefused, SwitchRequest


def body(tmp_path, **settings) -> dict:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    return {"model_path": str(model), "package": "m", "settings": settings}


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"threads": 0}, "settings.threads: a whole number from 1 to 256"),
        ({"threads": 257}, "settings.threads: a whole number from 1 to 256"),
        ({"sequences": 100_000}, "settings.sequences: a whole number from 1 to 256"),
        ({"ctx_per_seq": 255}, "settings.ctx_per_seq: a whole number from 256 to 131072"),
        ({"ctx_per_seq": 10**7}, "settings.ctx_per_seq: a whole number from 256 to 131072"),
        ({"host_ram_mib": 2**21}, "settings.host_ram_mib: a whole number from 1 to 1048576"),
        ({"threads": 2.5}, "settings.threads: a whole number from 1 to 256"),
        ({"threads": True}, "settings.threads: a whole number from 1 to 256"),
    ],
)
def test_it_refuses_a_setting_out_of_its_bounds_naming_it(tmp_path, settings, message):
    with pytest.raises(SwitchRefused) as refused:
        SwitchRequest.from_body(body(tmp_path, **settings))
    assert str(refused.value) == message


def test_it_takes_each_setting_at_its_bounds(tmp_path):
    for key, (low, high) in LIMITS.items():
        for value in (low, high):
            assert SwitchRequest.from_body(body(tmp_path, **{key: value})).settings == {key: value}


def test_the_control_plane_checks_the_same_bounds():
    assert plan.NODE_SETTING_LIMITS is LIMITS


def test_it_refuses_sequences_and_context_too_many_together_with_what_it_runs(tmp_path):
    from inference.engine.config import EngineConfig

    running = EngineConfig(model_path="old.gguf", sequences=8, ctx_per_seq=2048)
    fits = SwitchRequest.from_body(body(tmp_path, ctx_per_seq=131_072))  # 8 * 131,072 = 2^20
    assert fits.config(running).ctx_per_seq == 131_072
    too_many = SwitchRequest.from_body(body(tmp_path, sequences=16, ctx_per_seq=131_072))
    with pytest.raises(SwitchRefused) as refused:
        too_many.config(running)
    assert str(refused.value) == (
        "settings.sequences * ctx_per_seq: 16 * 131072 = 2,097,152 KV cells, over the "
        "1,048,576 one node's context may hold"
    )

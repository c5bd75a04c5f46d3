"""The BOS token is added once, whether or not the chat template writes it."""

from __future__ import annotations

from nodes.agent.completions import needs_bos


def test_a_template_that_writes_the_bos_gets_no_second_one():
    assert needs_bos("<bos><start_of_turn>user\nhi", bos_token="<bos>", add_bos=True) is False
    assert needs_bos("<start_of_turn>user\nhi", bos_token="<bos>", add_bos=True) is True


def test_a_model_without_a_bos_gets_none():
    assert needs_bos("<|im_start|>user\nhi", bos_token="<|im_start|>", add_bos=False) is False
    assert needs_bos("hi", bos_token="", add_bos=True) is True

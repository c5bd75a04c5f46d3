"""Incremental detokenization and stop strings."""

from __future__ import annotations

from inference.engine.text import TextAssembler


def feed(pieces: list[bytes], stops: tuple[str, ...] = ()) -> tuple[list[str], TextAssembler]:
    assembler = TextAssembler(stops=stops)
    deltas = [assembler.push(p) for p in pieces]
    deltas.append(assembler.finish())
    return [d for d in deltas if d], assembler


def test_it_never_splits_a_character_across_deltas() -> None:
    text = "héllo 😀 猫"
    raw = text.encode()
    deltas, assembler = feed([raw[i : i + 1] for i in range(len(raw))])
    assert "".join(deltas) == text == assembler.text
    assert all("\ufffd" not in d for d in deltas)


def test_it_holds_back_a_possible_stop_string_and_cuts_at_it() -> None:
    deltas, assembler = feed([b"one tw", b"o ST", b"OP three"], stops=("STOP",))
    assert "".join(deltas) == "one two " == assembler.text
    assert assembler.stopped


def test_it_releases_held_text_that_turned_out_not_to_be_a_stop() -> None:
    deltas, assembler = feed([b"a S", b"T", b"x"], stops=("STOP",))
    assert "".join(deltas) == "a STx" and not assembler.stopped


def test_it_drops_a_character_cut_off_at_the_end() -> None:
    deltas, assembler = feed(["ok 😀".encode()[:-2]])
    assert "".join(deltas) == "ok " == assembler.text


def test_it_emits_at_once_what_cannot_begin_a_stop_string() -> None:
    assembler = TextAssembler(stops=("XY",))
    assert assembler.push(b"abc") == "abc"
    assert assembler.push(b" dX") == " d"  # "X" may begin "XY": held
    assert assembler.finish() == "X"  # the end: nothing can follow, so it is released


def test_it_holds_back_the_longest_partial_stop() -> None:
    assembler = TextAssembler(stops=("STOP",))
    assert assembler.push(b"one STO") == "one "
    assert assembler.push(b"P more") == "" and assembler.stopped
    assert assembler.text == "one "


def test_it_cuts_at_the_first_of_several_stops_in_one_piece() -> None:
    assembler = TextAssembler(stops=("STOP", "END"))
    assert assembler.push(b"a END b STOP c END") == "a " and assembler.text == "a "


def test_a_stop_string_at_the_very_start_yields_nothing() -> None:
    assembler = TextAssembler(stops=("<|im_end|>",))
    assert assembler.push(b"<|im_end|>rest") == "" and assembler.stopped
    assert assembler.text == "" and assembler.finish() == ""


def test_nothing_comes_out_after_a_stop() -> None:
    assembler = TextAssembler(stops=("STOP",))
    assembler.push(b"x STOP")
    assert assembler.push(b"more") == "" and assembler.finish() == ""
    assert assembler.text == "x "

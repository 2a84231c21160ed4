"""Stop strings are found in characters: with the tiny pair's byte-level tokenizer an emoji is 4
tokens and a CJK character 3, more tokens than any window sized from the stop's length."""

from __future__ import annotations

import pytest
from conftest import make_tokenizer

from specbatch.core import Row, SamplingParams, Status
from specbatch.sched.stops import StopChecker

STOPS = ["🙂🙂🙂", "停止生成吧"]  # 12 and 15 tokens: more than len(stop) + 8


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


def checker(tokenizer, calls: list[int] | None = None) -> StopChecker:
    def decode(ids: list[int]) -> str:
        if calls is not None:
            calls.append(len(ids))
        return str(tokenizer.decode(ids, skip_special_tokens=True))

    return StopChecker({tokenizer.eos_token_id}, decode, max_context=100_000)


def stop_row(*stops: str) -> Row:
    return Row("r", [5], SamplingParams(max_new_tokens=10_000, stop=stops))


def commit_in_rounds(stops: StopChecker, row: Row, tokens: list[int], round_size: int) -> int:
    """Commit tokens as rounds of `round_size` emissions, as the commit step does; returns how many
    were committed in all."""
    committed = 0
    for start in range(0, len(tokens), round_size):
        committed += stops.commit(row, tokens[start : start + round_size])
        if row.is_finished:
            break
    return committed


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("round_size", [1, 3, 5, 1000])  # 3 and 5 split the stop across rounds
def test_multibyte_stop_is_found_and_cut(tokenizer, stop, round_size):
    before = tokenizer.encode("Sure: ")
    tokens = before + tokenizer.encode(stop) + tokenizer.encode(" and more text after it")
    assert len(tokenizer.encode(stop)) > len(stop) + 8
    stops, row = checker(tokenizer), stop_row(stop)
    committed = commit_in_rounds(stops, row, tokens, round_size)
    end = len(before) + len(tokenizer.encode(stop))  # the token that completes the stop's last character
    assert row.status is Status.COMPLETED and row.finish_reason == "stop"
    assert committed == end and row.output_ids == tokens[:end]
    assert stops.text(row) == "Sure: "


@pytest.mark.parametrize("stop", STOPS)
def test_stop_in_the_first_tokens(tokenizer, stop):
    tokens = tokenizer.encode(stop + " rest")
    stops, row = checker(tokenizer), stop_row(stop)
    assert stops.commit(row, tokens) == len(tokenizer.encode(stop))
    assert row.finish_reason == "stop" and stops.text(row) == ""


def test_stop_after_a_broken_character(tokenizer):
    """A lone UTF-8 lead byte decodes to U+FFFD for good: the text after it is still searched."""
    lead_byte = tokenizer.encode("🙂")[0]
    tokens = [lead_byte] + tokenizer.encode("abc STOP tail")
    stops, row = checker(tokenizer), stop_row("STOP")
    stops.commit(row, tokens)
    assert row.finish_reason == "stop" and stops.text(row) == "\ufffdabc "


def test_no_stop_decodes_each_token_a_bounded_number_of_times(tokenizer):
    """Long outputs stay linear: the decoded tokens per committed token do not grow with the output."""
    tokens = tokenizer.encode("The quick brown 🙂 fox 停止 jumps. " * 60)
    calls: list[int] = []
    stops, row = checker(tokenizer, calls), stop_row("🙂🙂🙂", "never")
    assert commit_in_rounds(stops, row, tokens, 4) == len(tokens)
    assert row.status is Status.WAITING and row.finish_reason is None
    assert max(calls) <= 8 and sum(calls) < 6 * len(tokens)  # a few tokens per decode, never the output

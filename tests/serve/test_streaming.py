"""A prompt's tokens as text: stop tokens, stop strings split across tokens, held-back text; prompts
tokenised on the event loop or a worker thread."""

import asyncio
import threading
from types import SimpleNamespace

import pytest

from pipeline.errors import UserError
from pipeline.runtime.sampling import Sampling
from pipeline.tokenizer import embedded_gpt2_tokenizer, token_bytes

pytest.importorskip("fastapi", reason="the [serve] extra is not installed")
from serve.streaming import INLINE_CHARS, Hub, RowOutput  # noqa: E402

TOKENIZER = embedded_gpt2_tokenizer()
TABLE = token_bytes(TOKENIZER)
EOS = TOKENIZER.eos_token_id


def feed(row: RowOutput, tokens: list[int]) -> list[str]:
    """The text pieces a stream would send, one read after each token."""
    pieces = []
    for token in tokens:
        row.add(token)
        pieces.append(row.new_text())
    return pieces


def test_a_stop_string_across_tokens_cuts_the_text_before_it_and_nothing_after_is_sent():
    tokens = TOKENIZER("The cat sat on the mat. Then it left.")["input_ids"]
    row = RowOutput(TABLE, Sampling(max_new_tokens=50), stop=("on the m",))
    pieces = feed(row, tokens)
    assert "".join(pieces) == "The cat sat " and row.finish == "stop"
    assert len(row.tokens) == tokens.index(TOKENIZER(" mat")["input_ids"][0]) + 1  # up to the token that completed it
    assert all("on" not in p for p in pieces)  # the stop string's start was held back, never sent


def test_text_that_cannot_start_a_stop_string_is_sent_at_once_bar_the_held_tail():
    tokens = TOKENIZER("one two three four")["input_ids"]
    row = RowOutput(TABLE, Sampling(max_new_tokens=len(tokens)), stop=("xyz",))
    sent, held = 0, []
    for token in tokens:
        row.add(token)
        sent += len(row.new_text())
        held.append(len(row.text) - sent)
    assert row.text == "one two three four" and row.finish == "length"
    assert held[-1] == 0 and max(held[:-1]) == 2  # len("xyz") - 1 characters wait until the row ends


def test_a_stop_token_ends_the_row_and_later_tokens_are_ignored():
    row = RowOutput(TABLE, Sampling(max_new_tokens=10, stop_tokens=(EOS,)))
    feed(row, [464, EOS, 464])
    assert row.tokens == [464, EOS] and row.text == "The" and row.finish == "stop"
    assert row.new_tokens() == [464, EOS] and row.new_tokens() == []


def test_a_character_split_over_tokens_arrives_whole():
    tokens = TOKENIZER("日本")["input_ids"]
    row = RowOutput(TABLE, Sampling(max_new_tokens=len(tokens)))
    pieces = feed(row, tokens)
    assert "".join(pieces) == "日本" and "\ufffd" not in "".join(pieces) and "" in pieces


def test_short_prompts_are_tokenised_on_the_event_loop_long_ones_on_a_thread_with_the_same_ids_and_errors():
    hub = Hub(TOKENIZER, SimpleNamespace(info={"context": 1024}), max_prompts=4, timeout_s=1.0, metrics=None)
    threads, encode = [], hub.encode

    def recorded(*args):
        threads.append(threading.get_ident())
        return encode(*args)

    hub.encode = recorded
    short, long = "The cat sat on the mat.", "word " * (INLINE_CHARS // 5 + 1)

    async def tokenize(texts, max_new_tokens=8):
        return await hub.tokenize(texts, Sampling(max_new_tokens=max_new_tokens), "max_tokens")

    async def main():
        loop = threading.get_ident()
        assert await tokenize([short]) == [TOKENIZER(short)["input_ids"]] and threads[-1] == loop
        assert await tokenize([long]) == [TOKENIZER(long)["input_ids"]] and threads[-1] != loop
        for texts in ([short], [long]):  # the same UserError, wherever it was raised
            with pytest.raises(UserError, match="exceeds the model's context of 1024"):
                await tokenize(texts, max_new_tokens=1024)
    asyncio.run(main())

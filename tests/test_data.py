import itertools

import numpy as np
import pytest
import torch

from pipeline.artifacts import RunDir
from pipeline.config import load_config
from pipeline.data import (
    PackedBlocks,
    ResumableSampler,
    embedded_corpus,
    heldout_blocks,
    prepare_data,
)
from pipeline.errors import UserError
from pipeline.tokenizer import embedded_gpt2_tokenizer


def test_embedded_corpus_is_large_and_english():
    docs = embedded_corpus()
    assert sum(map(len, docs)) > 2_000_000
    assert sum(" the " in d for d in docs) > len(docs) / 3


def test_prepare_data_splits_and_is_cached(micro_config, tmp_path):
    cfg = micro_config()
    run = RunDir(tmp_path / "run")
    splits = prepare_data(cfg, run, embedded_gpt2_tokenizer())
    train, held = splits.tokens("train"), splits.tokens("heldout")
    assert train.size > 20 * held.size / 2 and held.size > cfg.data.block_size
    assert int(train.max()) < 50257 and (train == 50256).any()  # EOS between documents
    stamp = splits.train.stat().st_mtime_ns
    prepare_data(cfg, run, embedded_gpt2_tokenizer())
    assert splits.train.stat().st_mtime_ns == stamp  # up to date: not rewritten


def test_packed_blocks_are_shifted_windows(micro_config, tmp_path):
    cfg = micro_config()
    splits = prepare_data(cfg, RunDir(tmp_path / "run"), embedded_gpt2_tokenizer())
    blocks = PackedBlocks(splits.train, 32)
    x, y = blocks[3]
    tokens = splits.tokens("train")
    assert x.shape == y.shape == (32,)
    assert torch.equal(x[1:], y[:-1])
    assert x.tolist() == tokens[96:128].tolist() and y[-1].item() == tokens[128]


def test_sampler_resumes_at_any_position():
    full = list(itertools.islice(iter(ResumableSampler(10, seed=3)), 35))
    assert sorted(full[:10]) == list(range(10)) and full[:10] != full[10:20]
    resumed = list(itertools.islice(iter(ResumableSampler(10, seed=3, start=17)), 18))
    assert resumed == full[17:]


@pytest.mark.parametrize("content, message", [
    ("", "the corpus is empty"),
    ("just a few words", "fewer than one block"),
])
def test_too_little_text_is_refused(tmp_path, content, message):
    corpus = tmp_path / "small.txt"
    corpus.write_text(content)
    cfg = load_config("tiny", overrides=[f"data.source={corpus}"])
    with pytest.raises(UserError, match=message):
        prepare_data(cfg, RunDir(tmp_path / "run"), embedded_gpt2_tokenizer())
    assert not (tmp_path / "run" / "data" / "train.bin").exists() or message != "the corpus is empty"


def test_missing_corpus_names_the_option(tmp_path):
    cfg = load_config("tiny", overrides=[f"data.source={tmp_path / 'nope'}"])
    with pytest.raises(UserError, match="--data .*nope: no such file"):
        prepare_data(cfg, RunDir(tmp_path / "run"), embedded_gpt2_tokenizer())


def test_heldout_blocks_come_from_heldout(micro_config, tmp_path):
    cfg = micro_config()
    splits = prepare_data(cfg, RunDir(tmp_path / "run"), embedded_gpt2_tokenizer())
    blocks = heldout_blocks(splits, 4, 16, "data.calib_samples")
    assert blocks.shape == (4, 16) and blocks.dtype == np.int64
    assert blocks[0].tolist() == splits.tokens("heldout")[:16].tolist()
    tail = heldout_blocks(splits, 2, 16, "validate.prompts", from_end=True)
    held = splits.tokens("heldout")
    assert tail[-1].tolist() == held[(held.size // 16 - 1) * 16:(held.size // 16) * 16].tolist()
    with pytest.raises(UserError, match="lower data.calib_samples"):
        heldout_blocks(splits, 10**6, 16, "data.calib_samples")

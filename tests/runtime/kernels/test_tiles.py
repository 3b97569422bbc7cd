"""The decode kernels' tile chooser: a valid configuration for every GPT-2 shape and batch, tuned
or not (the kernels themselves run against PyTorch in tests/runtime/static/test_triton_backend.py)."""

import pytest

from pipeline.config import PRESETS, load_config

pytest.importorskip("triton")
from pipeline.runtime.kernels.tiles import LinearConfig, attention_config, layer_norms_apart, linear_config  # noqa: E402


def step_products(n_embd: int, vocab: int) -> list[tuple[int, int, bool]]:
    """A decode step's linears as (n, k, residual): QKV, attention out, fc, fc out, the LM head."""
    return [(3 * n_embd, n_embd, False), (n_embd, n_embd, True), (4 * n_embd, n_embd, False),
            (n_embd, 4 * n_embd, True), (vocab, n_embd, False)]


@pytest.mark.parametrize("narrow", [False, True], ids=["fp16-weights", "one-byte-weights"])
@pytest.mark.parametrize("preset", [*PRESETS, "25-heads-of-16"])
def test_every_shape_and_batch_gets_a_configuration_its_kernel_takes(preset, narrow):
    """gpt2-xl's 1,600-wide rows are no multiple of the 128-wide K tile: the chooser once found no
    split there and raised at batch 8 and 64. Whatever it picks, for fp16 weights or one-byte ones,
    must be a split the kernel accepts."""
    model = load_config(preset).model if preset in PRESETS else load_config("tiny", overrides=["model.n_embd=400",
                                                                                                "model.n_head=25"]).model
    for rows in range(1, 65):
        for n, k, residual in step_products(model.n_embd, model.vocab_size):
            cfg = linear_config(rows, n, k, residual, narrow)
            assert cfg.block_n > 0 and cfg.split_k >= 1
            if cfg.split_k > 1:
                assert residual
                step = 1 if cfg.block_m == 1 else cfg.block_k
                assert k % (cfg.split_k * step) == 0, (rows, n, k, cfg)
        assert attention_config(rows, heads=model.n_head).splits >= 1


def test_the_124m_shape_keeps_its_measured_tiles_and_gpt2_xl_takes_narrower_ones():
    """The tuned shape's residual splits are the ones the H200 sweeps chose (docs/journal/decode_notes_h200.md);
    1,600 is cut into 64-wide tiles."""
    assert (linear_config(64, 768, 768, True).block_k, linear_config(64, 768, 768, True).split_k) == (128, 6)
    assert (linear_config(64, 768, 3072, True).block_k, linear_config(64, 768, 3072, True).split_k) == (128, 8)
    assert linear_config(8, 768, 1600, True).split_k == 5 and linear_config(8, 768, 1600, True).block_k == 64


def test_the_layer_norms_go_apart_above_16_rows_from_gpt2_medium_up():
    """There the QKV and fc products take 64-row tiles (each weight read once), the LM head its own;
    for one-byte weights from gpt2-large up."""
    assert layer_norms_apart(64, 1024) and layer_norms_apart(17, 1600) and layer_norms_apart(64, 1280, narrow=True)
    assert not (layer_norms_apart(16, 1600) or layer_norms_apart(64, 768) or layer_norms_apart(64, 1024, narrow=True))
    # fp16: six stages at 1,024, four at 1,280; at 1,600 128-wide K tiles six deep, the weights the left operand.
    # One-byte weights keep 64-row tiles four deep, and so do fp32's, whose deep ones at 1,600 would need 320 KB
    # of shared memory (compiled for sm90; it has 227)
    assert linear_config(64, 3072, 1024, False) == LinearConfig(64, 32, 128, stages=6)
    assert linear_config(64, 5120, 1280, False) == LinearConfig(64, 32, 128, stages=4)
    assert linear_config(64, 6400, 1600, False) == LinearConfig(64, 64, 128, stages=6, weights_left=True)
    assert linear_config(64, 3840, 1280, False, narrow=True) == LinearConfig(64, 32, 128, stages=4)
    assert linear_config(64, 6400, 1600, False, narrow=True) == LinearConfig(64, 32, 64, stages=4)
    assert linear_config(64, 6400, 1600, False, fp32=True) == LinearConfig(64, 32, 64, stages=4)
    assert linear_config(64, 3072, 1024, False, narrow=True) == LinearConfig(16, 128, 128, stages=4)
    assert linear_config(64, 50257, 1600, False).block_n == 128


def test_one_byte_weights_take_their_own_tiles_where_their_sweep_found_better():
    """int8 / fp8 weights (docs/journal/performance.md, "one-byte weights"): 8 rows of the residual
    products in 128-wide K tiles, 64 rows of gpt2-xl's QKV in 16-row tiles, 8 rows of the LM head
    in 128-wide ones; one row keeps fp16's row products (the whole step's A/B)."""
    for n, k, residual in ((4800, 1600, False), (1600, 6400, True), (50257, 768, False)):
        assert linear_config(1, n, k, residual, narrow=True) == linear_config(1, n, k, residual)
    assert linear_config(8, 768, 3072, True, narrow=True) == LinearConfig(16, 32, 128, 8)
    assert linear_config(64, 2304, 768, False, narrow=True) == LinearConfig(16, 128, 128, stages=4)
    assert linear_config(8, 50257, 768, False, narrow=True).block_n == 128

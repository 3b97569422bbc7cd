"""The triton backend's decode kernels, run by Triton's interpreter on the CPU (numpy, the same
kernel code the GPU compiles; conftest selects it) against StaticGPT2's PyTorch forward."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline.accuracy import compare_logits
from pipeline.export.int8 import export_int8_weight_only
from pipeline.int8_weights import quantize_rows, read_graph_weights
from pipeline.precisions import PRECISIONS
from pipeline.runtime.backend import BackendUnavailable
from pipeline.runtime.batch import left_pad
from pipeline.runtime.generate import Generator
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.static.torch_compiled import TorchCompiledBackend

pytest.importorskip("triton")

if torch.cuda.is_available():  # conftest chose the interpreter only where there is no GPU
    pytest.skip("these check the kernels in Triton's interpreter, on a CPU-only machine", allow_module_level=True)
from pipeline.runtime.kernels.linear_kernels import fused_linear  # noqa: E402
from pipeline.runtime.kernels.tiles import LinearConfig  # noqa: E402
from pipeline.runtime.static.triton_backend import TritonBackend  # noqa: E402

# Rows of different lengths (left padding), the longest past one 64-slot attention block.
PROMPTS = [list(range(3, 73)), [7, 8], list(range(40, 80, 2))]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=128, vocab_size=512)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # a fresh model's layer norms are the identity, which would hide their gamma and beta
        for name, p in model.named_parameters():
            if ".ln_" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def int8_graph(model, tmp_path_factory):
    """The model's int8-wo graph, as export writes it."""
    path = tmp_path_factory.mktemp("int8-wo") / "model.onnx"
    export_int8_weight_only(model, path, 18)
    return path


@pytest.fixture(scope="module")
def int8_weights(model, int8_graph):
    return read_graph_weights(int8_graph, model.config)


def decode_logits(backend, batch):
    """Prefill the batch, then one decode step; its logits [B, 1, V]."""

    rows = batch.input_ids.shape[0]
    backend.reset(rows, batch.input_ids.shape[1] + 1)
    backend.prefill(batch)
    return backend.decode(torch.arange(11, 11 + rows)[:, None], batch.position_ids[:, -1:] + 1)[:, None].clone()


# one row takes the row-product kernels, several the tensor-core tiles (tiles.linear_config),
# more than 16 an LM head whose input a launch of its own normalises (tiles.head_normalized_apart)
@pytest.mark.parametrize("rows", [1, 3, 20])
@pytest.mark.parametrize("precision, budget", [("fp32", 1e-5), ("fp16", 5e-3)])
def test_decode_step_matches_static_gpt2(model, precision, budget, rows):
    batch = left_pad((PROMPTS * 7)[:rows], 0, torch.device("cpu"))
    reference = decode_logits(TorchCompiledBackend(model, "fp32", "cpu", compile=False), batch)
    fused = decode_logits(TritonBackend(model, precision, "cpu"), batch)
    assert compare_logits(fused, reference)["rel_error"] < budget


def test_an_odd_head_count_and_widths_no_tile_divides_match_static_gpt2():
    """25 heads as gpt2-xl has, 200 wide: the residual products' K (200, 800) is no multiple of the
    128-wide tile, so the chooser's narrower tiles run (800 in 5 K slices of 32-wide tiles, 200
    unsplit and masked) in the tensor-core tiles several rows take. (Interpreted: 2 rows, 5 tokens.)"""
    torch.manual_seed(1)
    odd = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=25, n_embd=200, n_positions=64, vocab_size=256)).eval()
    batch = left_pad([[5, 6, 7], [8, 9]], 0, torch.device("cpu"))
    reference = decode_logits(TorchCompiledBackend(odd, "fp32", "cpu", compile=False), batch)
    assert compare_logits(decode_logits(TritonBackend(odd, "fp32", "cpu"), batch), reference)["rel_error"] < 1e-5


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn], ids=["int8", "fp8"])
# one row: row products; three: tiles, the weights either operand
@pytest.mark.parametrize("rows, weights_left", [(1, False), (3, False), (3, True)], ids=["row", "right", "left"])
@pytest.mark.parametrize("ln, residual, split_k", [(False, False, 1), (True, False, 1), (False, True, 2)])
def test_one_byte_weights_read_in_the_kernel_equal_dequantise_then_matmul(rows, ln, residual, split_k, dtype,
                                                                          weights_left):
    """fused_linear over int8 or fp8 weights and their scales (row products at one row, tiles at three,
    with the folded layer norm, and split K into a residual; the tiles with the weights as either
    operand) against the same product in fp32 over the dequantised weights (within fp16's rounding:
    the tiles take x, or its layer norm, in fp16, the activations' type in int8-wo)."""
    torch.manual_seed(2)
    x, w = (torch.randn(rows, 64) * 2 + 0.5).half().float(), torch.randn(48, 64)
    q, scale = quantize_rows(w, dtype)
    real = q.float() * scale[:, None]
    bias = torch.randn(48)
    out = torch.randn(rows, 48) if residual else torch.empty(rows, 48)
    expected = (torch.nn.functional.layer_norm(x, (64,), eps=1e-5) if ln else x) @ real.t() + bias
    if residual:
        expected += out
    block_m = 1 if rows == 1 else 16
    fused_linear(x, q, out, bias, ln=(real.sum(1), 1e-5) if ln else None, residual=residual, scale=scale,
                 config=LinearConfig(block_m, 16, 16 if block_m > 1 else 0, split_k, weights_left=weights_left))
    torch.testing.assert_close(out, expected, rtol=2e-3, atol=1e-2)
    with pytest.raises(ValueError, match="fp8 weights take their scale"):
        fused_linear(x, q, torch.empty(rows, 48))


@pytest.mark.parametrize("precision", ["fp32", "int8-wo"])
def test_layer_norms_apart_decode_as_the_fused_ones(model, int8_weights, precision, monkeypatch):
    """Above 16 rows of a model from gpt2-medium's width up, the QKV and fc products take x normalised
    by a launch of their own (forced here for the small model's three rows): the fused norm's logits."""
    from pipeline.runtime.static import triton_backend
    batch = left_pad(PROMPTS, 0, torch.device("cpu"))
    weights = int8_weights if precision == "int8-wo" else None
    fused = decode_logits(TritonBackend(model, precision, "cpu", int8_weights=weights), batch)
    monkeypatch.setattr(triton_backend, "layer_norms_apart", lambda rows, width, narrow: True)
    apart = decode_logits(TritonBackend(model, precision, "cpu", int8_weights=weights), batch)
    assert compare_logits(apart, fused)["rel_error"] < 2e-3


def test_int8_wo_decodes_within_its_budget_and_keeps_the_greedy_tokens(model, int8_weights):
    """The int8-wo triton backend (the int8-wo graph's weights, fp16 activations) against StaticGPT2
    fp32: logits within int8-wo's budget, and the greedy tokens of the fp16 backend."""
    batch = left_pad(PROMPTS, 0, torch.device("cpu"))
    reference = decode_logits(TorchCompiledBackend(model, "fp32", "cpu", compile=False), batch)
    int8 = TritonBackend(model, "int8-wo", "cpu", int8_weights=int8_weights)
    assert int8.precision == "int8-wo" and int8.decode_weights.of("qkv", 0)[0].dtype == torch.int8
    assert compare_logits(decode_logits(int8, batch), reference)["rel_error"] < PRECISIONS["int8-wo"].budget.max_rel_error
    s = Sampling(max_new_tokens=6)
    fp16 = Generator(TritonBackend(model, "fp16", "cpu"), pad_id=0).generate(PROMPTS, s)
    assert Generator(TritonBackend(model, "int8-wo", "cpu", int8_weights=int8_weights), pad_id=0).generate(PROMPTS, s) == fp16


def test_int8_wo_runs_the_int8_wo_graphs_weights_and_answers_as_onnx_runtime_does_on_it(model, int8_graph, int8_weights):
    """Like with like: the decode reads the very integers and scales of the graph export wrote, and
    its logits differ from ONNX Runtime's on that graph by fp16 activations only, far inside the
    int8-wo budget that each meets against fp32."""
    from pipeline.contract import Contract
    from pipeline.runtime.dynamic.ort_backend import OrtBackend
    triton = TritonBackend(model, "int8-wo", "cpu", int8_weights=int8_weights)
    for name, (q, scale) in int8_weights.items():
        w, s, _ = triton.decode_weights.of(name, None)
        assert torch.equal(w[..., :q.shape[-2], :], q) and torch.equal(s[..., :q.shape[-2]], scale)
    batch = left_pad(PROMPTS, 0, torch.device("cpu"))
    graph = OrtBackend(int8_graph, Contract.from_hf_config(model.config), "int8-wo", torch.device("cpu"), 128)
    ort_logits = decode_logits(graph, batch)
    reference = decode_logits(TorchCompiledBackend(model, "fp32", "cpu", compile=False), batch)
    against_ort = compare_logits(decode_logits(triton, batch), ort_logits)["rel_error"]
    assert against_ort < 2e-3 and against_ort < compare_logits(ort_logits, reference)["rel_error"] / 2


def test_int8_wo_needs_its_graphs_weights(model, int8_weights):
    with pytest.raises(ValueError, match="int8_weights go with precision int8-wo"):
        TritonBackend(model, "int8-wo", "cpu")
    with pytest.raises(ValueError, match="int8_weights go with precision int8-wo"):
        TritonBackend(model, "fp16", "cpu", int8_weights=int8_weights)


def test_greedy_generation_matches(model):
    s = Sampling(max_new_tokens=6)
    reference = Generator(TorchCompiledBackend(model, "fp32", "cpu", compile=False), pad_id=0).generate(PROMPTS, s)
    assert Generator(TritonBackend(model, "fp32", "cpu"), pad_id=0).generate(PROMPTS, s) == reference


@pytest.mark.parametrize("s", [
    Sampling(max_new_tokens=6, do_sample=True, temperature=0.9, top_p=0.9, seed=5),
    Sampling(max_new_tokens=6, do_sample=True, temperature=1.1, top_k=20, repetition_penalty=1.3,
             frequency_penalty=0.4, seed=6),
    Sampling(max_new_tokens=6, presence_penalty=1.5),
], ids=["top_p", "top_k-penalties", "greedy-penalised"])
def test_sampled_generation_matches(model, s):
    """The sampled step's one launch after the step (the sampler with the greedy step's tail) draws what
    the torch sampler draws from the reference's logits."""
    reference = Generator(TorchCompiledBackend(model, "fp32", "cpu", compile=False), pad_id=0).generate(PROMPTS, s)
    assert Generator(TritonBackend(model, "fp32", "cpu"), pad_id=0).generate(PROMPTS, s) == reference


def test_a_head_size_the_kernels_cannot_hold_is_refused():
    odd = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=48, n_positions=32, vocab_size=64))
    with pytest.raises(BackendUnavailable, match="power-of-two head size; this model's is 24"):
        TritonBackend(odd, "fp32", "cpu")


@pytest.mark.parametrize("block_m", [1, 16])  # row products (K slices of 96, 48 and 32: masked past 48), tiles
@pytest.mark.parametrize("split_k", [1, 2, 3])
def test_split_k_adds_each_slice_and_the_bias_once(split_k, block_m):
    from pipeline.runtime.kernels.linear_kernels import fused_linear
    from pipeline.runtime.kernels.tiles import LinearConfig
    torch.manual_seed(1)
    x, w, bias = torch.randn(3, 96), torch.randn(48, 96), torch.randn(48)
    residual = torch.randn(3, 48)
    out = residual.clone()
    fused_linear(x, w, out, bias, residual=True, config=LinearConfig(block_m, 16, 16, split_k))
    torch.testing.assert_close(out, residual + x @ w.T + bias, rtol=1e-5, atol=1e-4)


# row products; tiles walking K in three 32-wide chunks, the weights as either operand
@pytest.mark.parametrize("block_m, weights_left", [(1, False), (16, False), (16, True)])
def test_layer_norm_and_gelu_over_several_k_chunks(block_m, weights_left):
    """The norm's weight and bias folded into the product, as StaticGPT2 folds them."""
    from pipeline.runtime.kernels.linear_kernels import fused_linear
    from pipeline.runtime.kernels.tiles import LinearConfig
    torch.manual_seed(3)
    x, w, bias = 3.0 + 2.0 * torch.randn(5, 96), torch.randn(40, 96) / 10, torch.randn(40)
    gamma, beta = 1.0 + torch.randn(96) / 5, torch.randn(96) / 5
    folded_w, folded_bias = w * gamma, bias + w @ beta
    out = torch.empty(5, 40)
    fused_linear(x, folded_w, out, folded_bias, ln=(folded_w.sum(1), 1e-5), gelu=True,
                 config=LinearConfig(block_m, 16, 32, weights_left=weights_left))
    normed = torch.nn.functional.layer_norm(x, (96,), gamma, beta, 1e-5)
    expected = torch.nn.functional.gelu(normed @ w.T + bias, approximate="tanh")
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_layer_norm_keeps_fp16_precision_for_rows_far_off_centre():
    """A row far off centre or with an outlier keeps fp16 precision: the tiles cast x minus a
    reference near its mean for the product, the row products centre x before its variance."""
    from pipeline.runtime.kernels.linear_kernels import fused_linear
    from pipeline.runtime.kernels.tiles import LinearConfig
    torch.manual_seed(4)
    x, w = 0.5 * torch.randn(4, 128), (torch.randn(64, 128) / 10).half()
    x[0] += 300.0
    x[3, 100] = 60.0
    reference = torch.nn.functional.layer_norm(x.double(), (128,), eps=1e-5) @ w.double().T
    for block_m in (1, 16):
        out = torch.empty(4, 64)
        fused_linear(x, w, out, ln=(w.float().sum(1), 1e-5), config=LinearConfig(block_m, 16, 64))
        assert ((out.double() - reference).norm(dim=1) / reference.norm(dim=1)).max() < 1e-3


def test_layer_norm_launch_matches_pytorch_in_the_output_dtype():
    from pipeline.runtime.kernels.linear_kernels import layer_norm
    torch.manual_seed(5)
    x = 0.5 * torch.randn(5, 48)  # 48: masked past it in a 64-wide block
    x[0] += 300.0
    out = torch.empty(5, 48, dtype=torch.float16)
    layer_norm(x, out, 1e-5)
    reference = torch.nn.functional.layer_norm(x.double(), (48,), eps=1e-5)
    assert ((out.double() - reference).abs().max() / reference.abs().max()) < 1e-3


def test_a_layer_norm_needs_one_weight_sum_per_row_of_w():
    from pipeline.runtime.kernels.linear_kernels import fused_linear
    with pytest.raises(ValueError, match="w_sums is \\(64,\\): it must be w.float\\(\\).sum\\(1\\)"):
        fused_linear(torch.randn(1, 64), torch.randn(16, 64), torch.empty(1, 16), ln=(torch.ones(64), 1e-5))


def test_split_k_needs_a_residual_fp32_output():
    from pipeline.runtime.kernels.linear_kernels import fused_linear
    from pipeline.runtime.kernels.tiles import LinearConfig
    with pytest.raises(ValueError, match="split_k=2 needs a residual fp32 output"):
        fused_linear(torch.randn(1, 64), torch.randn(16, 64), torch.empty(1, 16), config=LinearConfig(16, 16, 32, 2))


@pytest.mark.parametrize("fetch_ahead", [True, False], ids=["fetched-ahead", "loaded-where-used"])
@pytest.mark.parametrize("filled", [False, True], ids=["cache-shares", "filled-shares"])
@pytest.mark.parametrize("splits", [1, 2, 3, 4])
@pytest.mark.parametrize("block_t", [8, 64])
@pytest.mark.parametrize("slot", [0, 40, 63])
def test_attention_over_several_blocks_and_splits(block_t, splits, slot, filled, fetch_ahead):
    """The online softmax across blocks (BLOCK_T smaller than a program's share), walked either way
    (each next block fetched ahead, or each loaded where it is used), and the merge of
    the split programs' partials equal one softmax over the live slots; padding slots and slots past
    the step's are left out, the step's own slot counts wherever it falls (first slot, inside a
    share, last slot), whether the shares split the cache or each row's filled slots (read from the
    block that holds the row's first slot: the slots before that block are never read, live or not),
    and the arrival counters are left at zero for the next launch."""
    from pipeline.runtime.kernels.decode_attention import decode_attention
    from pipeline.runtime.kernels.tiles import AttentionConfig, attention_partials
    torch.manual_seed(2)
    b, h, t, d = 2, 2, 64, 16
    q, k, v = torch.randn(b, h * d), torch.randn(b, h, t, d), torch.randn(b, h, t, d)
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[1, :25] = False  # row 1 is left-padded
    out, arrivals = torch.empty(b, h * d), torch.zeros(b, h, dtype=torch.int32)
    config = AttentionConfig(splits, warps=4, block_t=block_t, fetch_ahead=fetch_ahead)
    partial = torch.empty(attention_partials(b, h, d, config))
    first = torch.tensor([min(20, slot), min(25, slot)])  # row 0's slots before its first are marked live
    decode_attention(q, k, v, mask, torch.tensor(slot), out, partial, arrivals, config=config,
                     first=first if filled else None)
    own = torch.arange(t) == slot  # counts even where the mask says padding
    block = min(block_t, 1 << (-(-t // splits) - 1).bit_length())  # decode_attention's BLOCK_T
    read = torch.arange(t) >= (first // block * block)[:, None] if filled else True
    live = ((mask & read & (torch.arange(t) <= slot)) | own)[:, None, None, :]
    expected = torch.nn.functional.scaled_dot_product_attention(q.view(b, h, 1, d), k, v, attn_mask=live)
    torch.testing.assert_close(out, expected.reshape(b, h * d), rtol=1e-5, atol=1e-5)
    assert not arrivals.any()


@pytest.mark.parametrize("block_m", [1, 16])
def test_greedy_advance_takes_the_first_largest_column_and_moves_the_inputs_on(block_m):
    """The LM head's per-program maxima reduce to torch.argmax (first column on ties, across programs);
    the token, its column of the output, the position, the slot mask, start and step all advance, and
    the next step's input embedding is written; a row whose advance is 0 (a free row of the serving
    scheduler) keeps its position."""
    from pipeline.runtime.kernels.linear_kernels import fused_linear
    from pipeline.runtime.kernels.step_tail import greedy_advance
    from pipeline.runtime.kernels.tiles import LinearConfig
    torch.manual_seed(5)
    x, w = torch.randn(3, 32), torch.randn(100, 32)
    x[0] = 1.0
    w[10] = w[70] = 1.0  # row 0: a tie between columns 10 and 70, seven programs apart
    logits, best, best_index = torch.empty(3, 100), torch.empty(3, 7), torch.empty(3, 7, dtype=torch.int32)
    fused_linear(x, w, logits, argmax=(best, best_index), config=LinearConfig(block_m, 16, 32))
    # a greedy step's head leaves only the maxima: the same ones, and nothing written elsewhere
    maxima, weights = (best.clone(), best_index.clone()), w.clone()
    fused_linear(x, w, None, argmax=(best, best_index), config=LinearConfig(block_m, 16, 32))
    assert torch.equal(best, maxima[0]) and torch.equal(best_index, maxima[1]) and torch.equal(w, weights)
    with pytest.raises(ValueError, match="out is None"):
        fused_linear(x, w, None)
    token, position = torch.zeros(3, 1, dtype=torch.long), torch.tensor([[4], [2], [7]])
    tokens = torch.zeros(4, 3, dtype=torch.long).t()  # [rows, steps], each step's column contiguous (new_slot)
    advance = torch.tensor([[1], [0], [1]])
    step, start = torch.tensor([2]), torch.tensor(5)
    slot_mask, arrivals = torch.zeros(3, 8, dtype=torch.bool), torch.zeros(1, dtype=torch.int32)
    wpe, embedded = torch.randn(8, 32), torch.zeros(3, 32)  # 8 positions: row 2's next (8) is past the last
    greedy_advance(best, best_index, token, tokens, step, position, advance, start, slot_mask, arrivals,
                   embedding=(w, wpe, embedded))
    expected = logits.argmax(-1)
    assert expected[0] == 10 and torch.equal(token[:, 0], expected) and torch.equal(tokens[:, 2], expected)
    assert tokens.count_nonzero() == expected.count_nonzero()  # nothing written in another step's column
    assert position.tolist() == [[5], [2], [8]] and int(start) == 6 and int(step) == 3 and int(arrivals) == 0
    assert slot_mask[:, 5].all() and slot_mask.sum() == 3  # the step's own slot, for the steps after it
    # the next step's input, as the embedding launch would make it (the last position where none is left)
    torch.testing.assert_close(embedded, w[expected] + wpe[[5, 2, 7]])


@pytest.mark.parametrize("last_only", [False, True])
def test_prefill_ops_match_pytorch(last_only):
    """The prefill's layer norm (with and without biases the stream owes) and its residual product
    in place (with and without its bias), also on the last position of each row, and its one-launch
    cache write give what TorchOps' PyTorch ops give."""
    from pipeline.runtime.kernels.prefill_kernels import TritonOps
    from pipeline.runtime.kernels.torch_ops import TorchOps
    torch.manual_seed(3)
    x, a = torch.randn(2, 5, 48).half() * 4 + 2, torch.randn(2, 5, 32).half()
    weight, bias = torch.rand(48) + 0.5, torch.randn(48)
    w, b, owed = torch.randn(48, 32).half() / 4, torch.randn(48).half(), torch.randn(48) * 3
    if last_only:
        x, a = x[:, -1:], a[:, -1:]
    for debt in (None, owed):
        expected = TorchOps.layer_norm(x.float(), debt, weight, bias, 1e-5)
        torch.testing.assert_close(TritonOps.layer_norm(x, debt, weight.half(), bias.half(), 1e-5).float(), expected,
                                   rtol=2e-3, atol=2e-3)
    for product_bias in (None, b):
        expected = TorchOps.add_linear(x.float(), a.float(), w.float(), None if product_bias is None else b.float())
        stream = x.clone() if not last_only else torch.randn(2, 5, 48).half()[:, -1:].copy_(x)
        got = TritonOps.add_linear(stream, a, w, product_bias)
        assert got.data_ptr() == stream.data_ptr()  # in place
        torch.testing.assert_close(got.float(), expected, rtol=2e-3, atol=2e-3)
    qkv = torch.randn(2, 5, 3 * 32)
    caches = [[torch.zeros(2, 4, 9, 8) for _ in range(2)] for _ in range(2)]
    TorchOps.write_cache(qkv, *caches[0], 3, torch.arange(3, 8))
    TritonOps.write_cache(qkv, *caches[1], 3, torch.arange(3, 8))
    assert caches[0][0][:, :, 3:8].abs().sum() > 0 and all(map(torch.equal, caches[0], caches[1]))


@pytest.mark.parametrize("seq", [5, 64, 70])  # within one block, exactly one, a second block's tail
def test_prefill_causal_attention_and_embedding_match_pytorch(seq):
    """The fused causal attention writes the cache slots 0..seq exactly as TorchOps does (and no
    other) and attends as SDPA's causal kernel; the embedding fused into the first layer norm gives
    TorchOps' gather, add and norm, for positions given per row and shared by every row."""
    from pipeline.runtime.kernels.prefill_kernels import TritonOps
    from pipeline.runtime.kernels.torch_ops import TorchOps
    torch.manual_seed(4)
    qkv = torch.randn(2, seq, 3 * 32)
    caches = [[torch.full((2, 2, seq + 9, 16), 7.0) for _ in range(2)] for _ in range(2)]
    expected = TorchOps.causal_attention(qkv, *caches[0])
    got = TritonOps.causal_attention(qkv, *caches[1])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert all(map(torch.equal, caches[0], caches[1])) and (caches[1][0][:, :, seq:] == 7).all()
    wte, wpe = torch.randn(50, 48).half() * 3, torch.randn(80, 48).half()
    weight, bias = torch.rand(48) + 0.5, torch.randn(48)
    ids = torch.randint(0, 50, (2, seq))
    for positions in (torch.arange(seq).expand(2, seq), torch.randint(0, 80, (2, seq))):
        want = TorchOps.embed_layer_norm(wte.float(), wpe.float(), ids, positions, weight, bias, 1e-5)
        fused = TritonOps.embed_layer_norm(wte, wpe, ids, positions, weight.half(), bias.half(), 1e-5)
        for g, w in zip(fused, want):
            torch.testing.assert_close(g.float(), w, rtol=2e-3, atol=2e-3)


def test_the_serving_scheduler_on_these_kernels_gives_every_job_its_tokens_alone(monkeypatch):
    """The continuous scheduler's plain greedy rows take the greedy kernel's step at every row count,
    from inputs it keeps in place: jobs wait, join freed rows while others run (a free row's position
    holds: its advance is 0) and leave at their lengths, the rows shifting left as they go (each row's
    attention reads from its first filled slot); each gets the tokens it gets alone. Driven step by
    step (no thread)."""
    from pipeline.runtime import admission, rows
    from pipeline.runtime import scheduler as scheduling
    torch.manual_seed(0)  # weights large enough that the picks change with what is attended (small ones repeat a token)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=128, vocab_size=128,
                                       initializer_range=0.3)).eval()
    monkeypatch.setattr(admission, "JOIN_EVERY", 2)  # the third job joins while the second runs
    monkeypatch.setattr(rows, "SHIFT_COLUMNS", 2)  # the rows move left while they run, their first slots too
    scheduler = scheduling.ContinuousScheduler(TritonBackend(model, "fp32", "cpu"), pad_id=0, max_rows=2)
    jobs = [([PROMPTS[i]], Sampling(max_new_tokens=n)) for i, n in enumerate([2, 6, 3])]
    steps = [[] for _ in jobs]
    for (prompts, sampling), got in zip(jobs, steps):
        scheduler.submit(scheduling.Job(prompts, sampling, lambda item, got=got: got.append(item)))
    while not all(got and got[-1] is None for got in steps):
        scheduler.admit(wait=False)
        scheduler.step()
    reference = Generator(TorchCompiledBackend(model, "fp32", "cpu", compile=False), pad_id=0)
    assert [[t[0] for t in got[:-1]] for got in steps] == [reference.generate(*job)[0] for job in jobs]


def test_a_row_that_joined_at_a_late_column_reads_its_own_slots_after_the_rows_shift(monkeypatch):
    """A short prompt joins while a long one runs, so its first slot lies blocks into the cache; once
    the long one leaves, the rows shift left by that much, and the row's attention must follow its
    first slot there (a stale one would skip the blocks that now hold its prompt)."""
    from pipeline.runtime import admission, rows
    from pipeline.runtime import scheduler as scheduling
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=128, vocab_size=64,
                                       initializer_range=0.3)).eval()
    monkeypatch.setattr(admission, "JOIN_EVERY", 1)
    monkeypatch.setattr(rows, "SHIFT_COLUMNS", 2)
    scheduler = scheduling.ContinuousScheduler(TritonBackend(model, "fp32", "cpu"), pad_id=0, max_rows=2)
    jobs = [([list(range(1, 45))], Sampling(max_new_tokens=12)), ([list(range(5, 13))], Sampling(max_new_tokens=24))]
    steps, firsts = [[], []], []
    scheduler.submit(scheduling.Job(*jobs[0], steps[0].append))
    scheduler.admit(wait=False)
    scheduler.step()
    scheduler.submit(scheduling.Job(*jobs[1], steps[1].append))
    while not all(got and got[-1] is None for got in steps):
        scheduler.admit(wait=False)
        firsts += [r.first_slot for r in scheduler.rows if r.job.prompts == jobs[1][0]]
        scheduler.step()
    assert max(firsts) >= 40 and min(firsts) == 0  # it joined blocks in, and the shift brought it to the front
    reference = Generator(TorchCompiledBackend(model, "fp32", "cpu", compile=False), pad_id=0)
    assert [[t[0] for t in got[:-1]] for got in steps] == [reference.generate(*job)[0] for job in jobs]



def test_the_opener_runs_the_runs_int8_wo_graph_and_nothing_else(exported_run, tmp_path):
    """The triton row's int8-wo reads the graph export wrote (its opener, called here past the device
    check, which wants a GPU), checked against the manifest: an edited graph is refused in one line,
    a missing one names the command that makes it."""
    from pipeline.errors import UserError
    from pipeline.model import load_checkpoint
    from pipeline.runtime.loader import BACKENDS
    from tests.conftest import copy_with_edited_graph

    _, run, _ = exported_run
    spec, cpu = BACKENDS["triton"], torch.device("cpu")
    assert spec.reads_for("int8-wo") == "onnx" and spec.reads_for("fp16") == "checkpoint"
    weights = read_graph_weights(run.onnx("int8-wo") / "model.onnx", load_checkpoint(run.checkpoint).config)
    backend = spec.open(run, "int8-wo", cpu, None)
    for name, (q, scale) in weights.items():
        w, s, _ = backend.decode_weights.of(name, None)
        assert torch.equal(w[..., :q.shape[-2], :], q) and torch.equal(s[..., :q.shape[-2]], scale)

    changed = copy_with_edited_graph(run, tmp_path / "changed", "int8-wo")
    with pytest.raises(UserError, match="not the int8-wo graph export wrote .its sha256 differs"):
        spec.verify(changed, "int8-wo")
    (changed.onnx("int8-wo") / "model.onnx").unlink()
    with pytest.raises(BackendUnavailable, match="no onnx/int8-wo graph in .*: run `gpt2-deploy export`"):
        spec.open(changed, "int8-wo", cpu, None)

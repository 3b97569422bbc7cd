"""The triton backend's decode kernels, run by Triton's interpreter on the CPU (numpy, the same
kernel code the GPU compiles; conftest selects it) against StaticGPT2's PyTorch forward."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline.accuracy import compare_logits
from pipeline.export.int8 import export_int8_weight_only
from pipeline.int8_weights import read_graph_weights
from pipeline.precisions import PRECISIONS
from pipeline.runtime.backend import BackendUnavailable
from pipeline.runtime.batch import left_pad
from pipeline.runtime.generate import Generator
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.scoring import eager_logits
from pipeline.runtime.static.torch_compiled import TorchCompiledBackend
from tests.runtime.conftest import scored_between_steps
from tests.runtime.static.test_row_local import row_local_logits

pytest.importorskip("triton")

if torch.cuda.is_available():  # conftest chose the interpreter only where there is no GPU
    pytest.skip("these check the kernels in Triton's interpreter, on a CPU-only machine", allow_module_level=True)
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


def test_int8_wo_holds_its_matrices_in_int8_only_and_prefills_on_them(model, int8_weights):
    """No float copy of a product's weights is kept for the prefill: every matrix is the graph's int8
    with its scales, and the weights the backend holds are fewer bytes than the fp16 backend's. Its
    prefill logits are StaticGPT2 fp32's within int8-wo's budget."""
    from pipeline.runtime.kernels.int8_products import RowScaled

    int8, fp16 = TritonBackend(model, "int8-wo", "cpu", int8_weights=int8_weights), TritonBackend(model, "fp16", "cpu")
    for name in ("qkv", "proj", "fc", "fc2", "head"):
        assert isinstance(getattr(int8.net, f"{name}_w"), RowScaled) and getattr(int8.net, f"{name}_w").q.dtype == torch.int8

    def held(backend) -> int:
        tensors = {id(t): t for t in backend.net.parameters()}
        for w, scale, sums in backend.decode_weights.weights.values():
            tensors.update({id(t): t for t in (w, scale, sums) if t is not None})
        return sum(t.numel() * t.element_size() for t in tensors.values())

    assert held(int8) < 0.75 * held(fp16)
    batch = left_pad(PROMPTS, 0, torch.device("cpu"))
    reference = TorchCompiledBackend(model, "fp32", "cpu", compile=False)
    for backend in (reference, int8):
        backend.reset(len(PROMPTS), 128)
    want, got = reference.prefill(batch, last_only=False).clone(), int8.prefill(batch, last_only=False).float()
    real = batch.attention_mask.bool()
    assert compare_logits(got[real], want[real])["rel_error"] < PRECISIONS["int8-wo"].budget.max_rel_error


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


def test_scores_on_its_own_prefill_between_two_steps(model):
    """Two short prompts (the interpreter is slow) and a sequence longer than their cache."""
    scored_between_steps(TritonBackend(model, "fp32", "cpu"), eager_logits(model, torch.device("cpu")), PROMPTS[1:],
                         [(5 * i) % model.config.vocab_size for i in range(1, 70)])


def test_row_local_kernels_give_a_row_its_logits_bitwise_in_any_row_beside_any_rows_from_any_slot(model):
    """Shares anchored at each row's first slot and no split-K (the interpreter adds atomics in program
    order, so this checks the placement; the run-to-run order is the GPU sitting's)."""
    logits = row_local_logits(TritonBackend(model, "fp32", "cpu"))
    assert all(torch.equal(logits[0], other) for other in logits[1:])


def test_a_head_size_the_kernels_cannot_hold_is_refused():
    odd = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=48, n_positions=32, vocab_size=64))
    with pytest.raises(BackendUnavailable, match="power-of-two head size; this model's is 24"):
        TritonBackend(odd, "fp32", "cpu")


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


def test_row_local_serving_gives_each_seeded_job_its_text_alone_and_beside_others(monkeypatch):
    """serve --deterministic on these kernels: seeded sampled jobs (and a greedy one) through the
    continuous scheduler one at a time, then all at once joining while others run: the same tokens."""
    from pipeline.runtime import admission
    from pipeline.runtime import scheduler as scheduling
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=128, vocab_size=128,
                                       initializer_range=0.3)).eval()
    monkeypatch.setattr(admission, "JOIN_EVERY", 1)
    backend = TritonBackend(model, "fp32", "cpu")
    backend.make_row_local()
    scheduler = scheduling.ContinuousScheduler(backend, pad_id=0, max_rows=4)
    jobs = [([PROMPTS[0]], Sampling(max_new_tokens=4, do_sample=True, temperature=1.0, top_p=0.95, seed=3)),
            ([PROMPTS[1]], Sampling(max_new_tokens=3, do_sample=True, temperature=0.9, seed=4)),
            ([PROMPTS[2]], Sampling(max_new_tokens=3))]

    def run(batch) -> list[list[int]]:
        steps = [[] for _ in batch]
        for (prompts, sampling), got in zip(batch, steps):
            scheduler.submit(scheduling.Job(prompts, sampling, got.append))
        while not all(got and got[-1] is None for got in steps):
            scheduler.admit(wait=False)
            scheduler.step()
        return [[t[0] for t in got[:-1]] for got in steps]

    alone = [run([job])[0] for job in jobs]
    assert run(jobs) == alone


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

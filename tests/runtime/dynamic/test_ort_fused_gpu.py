"""The ort target's graph on ONNX Runtime's CUDA provider: decode steps replayed from ONNX Runtime
CUDA graphs (one per cache shape) keep matching PyTorch, across resets and shapes."""

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline.accuracy import compare_logits
from pipeline.contract import ORT, Contract
from pipeline.runtime.batch import left_pad
from pipeline.runtime.dynamic.torch_eager import TorchEagerBackend

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def fused_fp16(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("needs onnxruntime-gpu (the CUDA execution provider)")
    from pipeline.export.ort_graph import export_ort_graph
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=128, n_positions=128)).eval()
    path = tmp_path_factory.mktemp("ort_gpu") / "model.onnx"
    export_ort_graph(model, "fp16", path, 18)
    return model, path


def test_captured_decode_steps_match_pytorch_across_resets_and_shapes(fused_fp16):
    from pipeline.runtime.dynamic.ort_fused import OrtFusedBackend
    model, path = fused_fp16
    cuda = torch.device("cuda")
    backend = OrtFusedBackend(path, Contract.from_hf_config(model.config, ORT), "fp16", cuda, 128)
    reference = TorchEagerBackend(model, "fp32")
    rng = np.random.default_rng(0)
    for rows, lengths in ((3, (9, 4, 6)), (3, (2, 9, 9)), (1, (7,))):  # the second replays the first one's graph
        prompts = [rng.integers(0, 50257, n).tolist() for n in lengths]
        found = []
        for b, device in ((backend, cuda), (reference, torch.device("cpu"))):
            batch = left_pad(prompts, 0, device)
            b.reset(rows, batch.host_ids.shape[1] + 12)
            logits = [b.prefill(batch).cpu().clone()]
            position = batch.position_ids[:, -1:]
            for step in range(12):
                position = position + 1
                tokens = torch.full((rows, 1), 100 + step, device=device)
                logits.append(b.decode(tokens, position).cpu().clone())
            found.append(logits)
        for step, (ours, ref) in enumerate(zip(*found)):
            assert compare_logits(ours, ref)["rel_error"] < 5e-3, (lengths, step)
    assert sorted(backend.caches) == [(1, 19), (3, 21)]


def test_padded_prompts_every_position_and_greedy_tokens_match_pytorch(fused_fp16):
    from pipeline.accuracy import measure
    from pipeline.runtime.dynamic.ort_fused import OrtFusedBackend
    model, path = fused_fp16
    backend = OrtFusedBackend(path, Contract.from_hf_config(model.config, ORT), "fp16", torch.device("cuda"), 128)
    prompts = [[464, 2068, 7586, 21831, 18045, 625], [15496, 995], [818, 262, 3726]]
    ours, ref = measure(backend, prompts, 8), measure(TorchEagerBackend(model, "fp32"), prompts, 8)
    assert compare_logits(ours["logits"], ref["logits"], ref["mask"])["rel_error"] < 5e-3
    assert compare_logits(ours["step_logits"], ref["step_logits"])["rel_error"] < 5e-3

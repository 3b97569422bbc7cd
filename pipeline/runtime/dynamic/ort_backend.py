"""ONNX Runtime backend (CPU or CUDA) with IO binding: inputs, logits and the KV cache are bound
by address to torch buffers on the device (PingPongKV), so nothing round-trips through the host
and nothing is allocated per step but the logits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from pipeline.contract import LOGITS, Contract
from pipeline.cores import usable_cores
from pipeline.errors import UserError
from pipeline.precisions import PRECISIONS
from pipeline.runtime.backend import BackendUnavailable
from pipeline.runtime.dynamic.kv_buffers import (
    Binding,
    ContractGraphBackend,
    PingPongKV,
)

NUMPY_OF = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}
TORCH_OF = {np.float32: torch.float32, np.float16: torch.float16, np.int64: torch.int64}
NUMPY_OF_TORCH = {t: n for n, t in TORCH_OF.items()}


def import_ort():
    try:
        import onnxruntime
    except ImportError:
        raise BackendUnavailable("onnxruntime is not installed: pip install 'gpt2-deploy[cpu]' (or [gpu])") from None
    return onnxruntime


def cannot_load(path: Path, runtime: str, error: Exception) -> UserError:
    """One line for an artifact the runtime refused, with its own first line of why."""
    first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
    return UserError(f"{path}: {runtime} cannot load it ({first}); rerun `gpt2-deploy export --force`")


def session_options(fuse_qdq: bool, config: dict[str, str] | None = None):
    """config: session config entries (ONNX Runtime ignores keys it does not know)."""
    ort = import_ort()
    options = ort.SessionOptions()
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    # Extended/all levels fuse Q/DQ pairs into integer kernels on the CPU, which changes the
    # numbers being validated; basic keeps the graph's arithmetic as written.
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if fuse_qdq
                                        else ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    if not fuse_qdq:
        # and folds each weight's DequantizeLinear into a float weight once, at load: the same values,
        # where ONNX Runtime otherwise dequantises every weight again each run (5-7x slower a step at
        # gpt2; docs/journal/performance.md, "One set of int8-wo weights")
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    options.intra_op_num_threads = usable_cores()
    options.log_severity_level = 3
    return options


def open_session(onnx_path: Path, contract: Contract, precision: str, device: torch.device, fuse_qdq: bool,
                 cuda_options: dict | None = None, session_config: dict[str, str] | None = None):
    """An InferenceSession on the device, checked to have the contract's inputs and outputs. On CUDA it
    works on torch's current stream, so torch's writes to bound inputs are ordered before each run."""
    ort = import_ort()
    if device.type == "cuda":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise BackendUnavailable("onnxruntime has no CUDA provider here: install onnxruntime-gpu ([gpu] extra)")
        if hasattr(ort, "preload_dlls"):
            ort.preload_dlls()  # CUDA/cuDNN from the nvidia-* wheels torch brought, rather than the system's
        stream = torch.cuda.current_stream(device).cuda_stream
        options = {"device_id": device.index or 0, "user_compute_stream": str(stream),
                   # an fp32 graph promises fp32 arithmetic: TF32 matmuls moved logits by 4e-5 on an H200
                   "use_tf32": "0" if precision == "fp32" else "1", **(cuda_options or {})}
        providers = [("CUDAExecutionProvider", options)]
    else:
        providers = ["CPUExecutionProvider"]
    try:
        session = ort.InferenceSession(str(onnx_path), session_options(fuse_qdq, session_config), providers=providers)
    except Exception as e:  # onnxruntime raises its own types for a truncated or foreign file
        raise cannot_load(onnx_path, "ONNX Runtime", e) from None
    missing = contract.missing({t.name for t in [*session.get_inputs(), *session.get_outputs()]})
    if missing:
        raise BackendUnavailable(f"{onnx_path}: not a graph of this pipeline's contract (no {', '.join(missing[:3])})")
    return session


def io_dtypes(session) -> dict[str, torch.dtype]:
    """{input or output name: its torch dtype}"""
    return {t.name: TORCH_OF[NUMPY_OF[t.type]] for t in [*session.get_inputs(), *session.get_outputs()]
            if t.type in NUMPY_OF}


def bind(binding, name: str, tensor: torch.Tensor, output: bool = False) -> None:
    """Bind a torch tensor's memory to an IO binding by address."""
    bind_to = binding.bind_output if output else binding.bind_input
    bind_to(name, tensor.device.type, tensor.device.index or 0, NUMPY_OF_TORCH[tensor.dtype], list(tensor.shape),
            tensor.data_ptr())


class OrtBackend(ContractGraphBackend):
    name = "ort"
    owns_cpu_threads = True

    def __init__(self, onnx_path: Path, contract: Contract, precision: str, device: str | torch.device = "cpu",
                 n_positions: int = 1024):
        self.precision, self.device, self.n_positions = precision, torch.device(device), n_positions
        self.session = open_session(onnx_path, contract, precision, self.device, not PRECISIONS[precision].qdq)
        dtypes = io_dtypes(self.session)
        self.vocab_size = contract.vocab_size
        self.kv = PingPongKV(contract, dtypes[contract.past_names[0]], self.device, dtypes[LOGITS])

    def run(self, inputs: Binding, outputs: Binding) -> None:
        binding = self.session.io_binding()
        for name, tensor in inputs:
            bind(binding, name, tensor)
        for name, tensor in outputs:
            bind(binding, name, tensor, output=True)
        self.session.run_with_iobinding(binding)

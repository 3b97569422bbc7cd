"""ONNX Runtime backend (CPU or CUDA) with IO binding: inputs, logits and the KV cache are bound
by address to torch buffers on the device (PingPongKV), so nothing round-trips through the host
and nothing is allocated per step but the logits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from pipeline.contract import LOGITS, Contract
from pipeline.errors import UserError
from pipeline.precisions import PRECISIONS
from pipeline.runtime.backend import BackendUnavailable
from pipeline.runtime.portable.kv_buffers import (
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


def session_options(precision: str):
    ort = import_ort()
    options = ort.SessionOptions()
    # Extended/all levels fuse Q/DQ pairs into integer kernels on the CPU, which changes the
    # numbers being validated; basic keeps the graph's arithmetic as written.
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if PRECISIONS[precision].qdq
                                        else ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    options.log_severity_level = 3
    return options


class OrtBackend(ContractGraphBackend):
    name = "ort"

    def __init__(self, onnx_path: Path, contract: Contract, precision: str, device: str | torch.device = "cpu",
                 n_positions: int = 1024):
        ort = import_ort()
        self.precision, self.device, self.n_positions = precision, torch.device(device), n_positions
        if self.device.type == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise BackendUnavailable("onnxruntime has no CUDA provider here: install onnxruntime-gpu ([gpu] extra)")
            if hasattr(ort, "preload_dlls"):
                ort.preload_dlls()  # CUDA/cuDNN from the nvidia-* wheels torch brought, rather than the system's
            stream = torch.cuda.current_stream(self.device).cuda_stream
            # ORT works on torch's stream, so torch's writes to bound inputs are ordered before it
            options = {"device_id": self.device.index or 0, "user_compute_stream": str(stream),
                       # an fp32 graph promises fp32 arithmetic: TF32 matmuls moved logits by 4e-5 on an H200
                       "use_tf32": "0" if precision == "fp32" else "1"}
            providers = [("CUDAExecutionProvider", options)]
        else:
            providers = ["CPUExecutionProvider"]
        try:
            self.session = ort.InferenceSession(str(onnx_path), session_options(precision), providers=providers)
        except Exception as e:  # onnxruntime raises its own types for a truncated or foreign file
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise UserError(f"{onnx_path}: ONNX Runtime cannot load it ({first}); rerun `gpt2-deploy export --force`") from None
        io = {t.name: t for t in [*self.session.get_inputs(), *self.session.get_outputs()]}
        missing = contract.missing(set(io))
        if missing:
            raise BackendUnavailable(f"{onnx_path}: not a graph of this pipeline's contract (no {', '.join(missing[:3])})")
        dtype_of = lambda name: TORCH_OF[NUMPY_OF[io[name].type]]  # noqa: E731
        self.vocab_size = contract.vocab_size
        self.ort_device = ("cuda", self.device.index or 0) if self.device.type == "cuda" else ("cpu", 0)
        self.kv = PingPongKV(contract, dtype_of(contract.past_names[0]), self.device, dtype_of(LOGITS))

    def _bind(self, binding, name: str, tensor: torch.Tensor, output: bool = False) -> None:
        bind = binding.bind_output if output else binding.bind_input
        bind(name, self.ort_device[0], self.ort_device[1], NUMPY_OF_TORCH[tensor.dtype], list(tensor.shape),
             tensor.data_ptr())

    def run(self, inputs: Binding, outputs: Binding) -> None:
        binding = self.session.io_binding()
        for name, tensor in inputs:
            self._bind(binding, name, tensor)
        for name, tensor in outputs:
            self._bind(binding, name, tensor, output=True)
        self.session.run_with_iobinding(binding)

"""ONNX Runtime backend (CPU or CUDA) with IO binding on preallocated buffers.

The contract graph takes `past` and returns `present = past + new` as a separate tensor. Two KV
buffers of the batch's maximum length are allocated once; each step reads `past` from one and
writes `present` into the other, then they swap roles. A tensor of shape [B, H, T, D] is laid
out contiguously from its buffer's start, so no per-step allocation or copy through the host
happens, on the CPU or the GPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from pipeline.runtime.backend import BackendUnavailable

NUMPY_OF = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}
TORCH_OF = {np.float32: torch.float32, np.float16: torch.float16, np.int64: torch.int64}
QDQ_PRECISIONS = ("int8", "int8-wo")


def _import_ort():
    try:
        import onnxruntime
    except ImportError:
        raise BackendUnavailable("onnxruntime is not installed: pip install 'gpt2-deploy[cpu]' (or [gpu])") from None
    return onnxruntime


def session_options(precision: str):
    ort = _import_ort()
    options = ort.SessionOptions()
    # Extended/all levels fuse Q/DQ pairs into integer kernels on the CPU, which changes the
    # numbers being validated; basic keeps the graph's arithmetic as written.
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if precision in QDQ_PRECISIONS
                                        else ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    options.log_severity_level = 3
    return options


class OrtBackend:
    name = "ort"

    def __init__(self, onnx_path: Path, precision: str, device: str | torch.device = "cpu", n_positions: int = 1024):
        ort = _import_ort()
        self.precision, self.device, self.n_positions = precision, torch.device(device), n_positions
        if self.device.type == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise BackendUnavailable("onnxruntime has no CUDA provider here: install onnxruntime-gpu ([gpu] extra)")
            stream = torch.cuda.current_stream(self.device).cuda_stream
            # ORT works on torch's stream, so torch's writes to bound inputs are ordered before it
            providers = [("CUDAExecutionProvider", {"device_id": self.device.index or 0, "user_compute_stream": str(stream)})]
        else:
            providers = ["CPUExecutionProvider"]
        self.session = ort.InferenceSession(str(onnx_path), session_options(precision), providers=providers)
        inputs = {i.name: i for i in self.session.get_inputs()}
        self.past_names = [n for n in inputs if n.startswith("past_key_values.")]
        self.present_names = [o.name for o in self.session.get_outputs() if o.name.startswith("present.")]
        first = inputs[self.past_names[0]]
        self.kv_np = NUMPY_OF[first.type]
        self.n_head, self.head_dim = first.shape[1], first.shape[3]
        logits = next(o for o in self.session.get_outputs() if o.name == "logits")
        self.logits_np, self.vocab_size = NUMPY_OF[logits.type], logits.shape[2]
        self.ort_device = ("cuda", self.device.index or 0) if self.device.type == "cuda" else ("cpu", 0)
        self.buffers: list[torch.Tensor] = []

    def reset(self, batch: int, max_len: int) -> None:
        size = batch * self.n_head * max_len * self.head_dim
        kv_dtype = TORCH_OF[self.kv_np]
        # [2 (ping, pong), 2L, flat]: each layer's k or v gets max_len positions' worth of room
        self.buffers = torch.empty(2, len(self.past_names), size, dtype=kv_dtype, device=self.device)
        self.batch, self.max_len, self.past_len, self.flip = batch, max_len, 0, 0

    def _bind(self, binding, name: str, tensor: torch.Tensor, np_type, shape, output: bool = False) -> None:
        bind = binding.bind_output if output else binding.bind_input
        bind(name, self.ort_device[0], self.ort_device[1], np_type, list(shape), tensor.data_ptr())

    def forward(self, input_ids, attention_mask, position_ids):
        batch, seq = input_ids.shape
        past, total = self.past_len, self.past_len + seq
        if batch != self.batch or total > self.max_len:
            raise ValueError(f"forward of batch {batch} to length {total} on a cache reset for {self.batch} x {self.max_len}")
        binding = self.session.io_binding()
        feeds = [t.to(self.device, torch.int64).contiguous() for t in (input_ids, attention_mask, position_ids)]
        for name, tensor in zip(("input_ids", "attention_mask", "position_ids"), feeds):
            self._bind(binding, name, tensor, np.int64, tensor.shape)
        src, dst = self.buffers[self.flip], self.buffers[1 - self.flip]
        kv_shape = (batch, self.n_head, past, self.head_dim)
        for j, name in enumerate(self.past_names):
            self._bind(binding, name, src[j], self.kv_np, kv_shape)
        for j, name in enumerate(self.present_names):
            self._bind(binding, name, dst[j], self.kv_np, (batch, self.n_head, total, self.head_dim), output=True)
        logits = torch.empty(batch, seq, self.vocab_size, dtype=TORCH_OF[self.logits_np], device=self.device)
        self._bind(binding, "logits", logits, self.logits_np, logits.shape, output=True)
        self.session.run_with_iobinding(binding)
        self.flip, self.past_len = 1 - self.flip, total
        return logits.float()

"""TensorRT backend: a plan from `build-engine`, checked against its metadata before it is
deserialised, run with `execute_async_v3` on torch's CUDA stream. Inputs and outputs are bound
by name to torch buffers; the KV cache is the same ping-pong pair as ONNX Runtime's, allocated
once per (batch, max length)."""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.artifacts import RunDir
from pipeline.contract import LOGITS, TOKEN_INPUTS, Contract
from pipeline.engines.flavours import by_name, import_flavour
from pipeline.engines.metadata import EngineMeta, check_runnable, plans_for
from pipeline.errors import UserError
from pipeline.runtime.backend import BackendUnavailable
from pipeline.runtime.dynamic.kv_buffers import (
    Binding,
    ContractGraphBackend,
    PingPongKV,
)


def _torch_dtype(trt, dtype) -> torch.dtype:
    return {trt.float32: torch.float32, trt.float16: torch.float16, trt.int64: torch.int64}[dtype]


def open_trt_backend(run: RunDir, contract: Contract, precision: str, device: torch.device) -> "TrtBackend":
    plans = plans_for(run.engines, precision)
    if not plans:
        raise BackendUnavailable(f"no {precision} engine in {run.engines}: run `gpt2-deploy build-engine`")
    if device.type != "cuda":
        raise BackendUnavailable("TensorRT engines run on a CUDA GPU, and none is visible")
    reasons = []
    for plan in plans:
        meta = EngineMeta.read(plan.with_suffix(".json"))
        try:
            trt = import_flavour(by_name(meta.flavour))
            check_runnable(meta, trt.__version__, torch.cuda.get_device_capability(device), plan)
        except UserError as e:
            reasons.append(str(e))
            continue
        return TrtBackend(plan, meta, trt, device, contract)
    raise BackendUnavailable(" / ".join(reasons))


class TrtBackend(ContractGraphBackend):
    name = "trt"

    def __init__(self, plan: Path, meta: EngineMeta, trt, device: torch.device, contract: Contract):
        self.precision, self.device, self.trt = meta.precision, device, trt
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        self.engine = self.runtime.deserialize_cuda_engine(plan.read_bytes())
        if self.engine is None:
            raise BackendUnavailable(f"{plan}: {meta.flavour} {meta.trt_version} could not deserialise it (see its log above)")
        self.context = self.engine.create_execution_context()
        missing = contract.missing({self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)})
        if missing:
            raise BackendUnavailable(f"{plan}: not an engine of this pipeline's contract (no {', '.join(missing[:3])})")
        dtype_of = lambda name: _torch_dtype(trt, self.engine.get_tensor_dtype(name))  # noqa: E731
        self.vocab_size = contract.vocab_size
        # the profile's largest batch, as Backend.max_rows: bench skips a larger batch saying so, serve caps prompts at it
        self.max_rows = meta.profile[contract.past_names[0]][2][0]
        self.n_positions = meta.profile[TOKEN_INPUTS[1]][2][1]  # the attention mask's longest: past + new tokens
        self.kv = PingPongKV(contract, dtype_of(contract.past_names[0]), device, dtype_of(LOGITS))

    def reset(self, batch: int, max_len: int) -> None:
        if batch > self.max_rows or max_len > self.n_positions:
            raise UserError(f"batch {batch} x length {max_len} is outside the engine's profile "
                            f"(batch <= {self.max_rows}, length <= {self.n_positions}); rebuild with a larger [engine] profile")
        super().reset(batch, max_len)

    def run(self, inputs: Binding, outputs: Binding) -> None:
        for name, tensor in inputs:
            self.context.set_input_shape(name, tuple(tensor.shape))
            self.context.set_tensor_address(name, tensor.data_ptr())
        for name, tensor in outputs:
            self.context.set_tensor_address(name, tensor.data_ptr())
        if not self.context.execute_async_v3(torch.cuda.current_stream(self.device).cuda_stream):
            raise RuntimeError("TensorRT execute_async_v3 failed (see its log above)")

"""ONNX Runtime on the ort target's graph (`export --target ort`): GroupQueryAttention reads and
writes one KV buffer per layer in place, so past and present are bound to the same memory, once.

The graph fills each row's cache from slot 0 and takes each row's length from the attention mask,
so a decode step marks one more slot per row in a mask of the cache's full length: every decode
input keeps its shape and address for the whole generation, and on CUDA a decode step is one
replay of an ONNX Runtime CUDA graph (one graph per cache shape; the prefill, whose shape varies,
runs uncaptured). Prompts of one length prefill as one batch; a padded batch prefills row by row,
each row's cache a contiguous slice of the buffer. On CUDA, ONNX Runtime works on a stream of the
backend's own (graph capture needs one) and the host does not wait for it after a run: events order
the caller's stream and this one both ways (_on_stream)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from pipeline.contract import LOGITS, LOGITS_TO_KEEP, ORT, TOKEN_INPUTS, Contract
from pipeline.runtime.backend import Backend, BackendUnavailable
from pipeline.runtime.batch import Batch, unpadded_mask_and_positions
from pipeline.runtime.dynamic.ort_backend import (
    bind,
    import_ort,
    io_dtypes,
    open_session,
)

NO_CAPTURE = "-1"  # ONNX Runtime's gpu_graph_id for a run that is neither captured nor replayed
# A decode step's matmuls have a handful of rows: ONNX Runtime times its own small-row kernels against
# cuBLAS's per shape and keeps the fastest (docs/journal/performance.md, "ONNX Runtime target")
CUDA_SESSION_CONFIG = {"ep.cuda.enable_gemm_auto_tune": "1"}


class SharedCache:
    """One cache shape's buffers: the KV tensors [2L][B, H, T, D], the mask [B, T] and a decode
    step's tokens, positions and logits, with the IO binding of a decode step over them."""

    def __init__(self, contract: Contract, batch: int, max_len: int, kv_dtype: torch.dtype,
                 logits_dtype: torch.dtype, device: torch.device, graph_id: int):
        c = contract
        self.batch, self.max_len, self.graph_id = batch, max_len, str(graph_id)
        # zeros: from torch.empty the H200 gave NaN logits (its kernels read past a row's length, it seems)
        self.kv = torch.zeros(2 * c.n_layer, batch, c.n_head, max_len, c.head_dim, dtype=kv_dtype, device=device)
        self.mask = torch.zeros(batch, max_len, dtype=torch.int64, device=device)
        self.tokens = torch.zeros(batch, 1, dtype=torch.int64, device=device)
        self.positions = torch.zeros(batch, 1, dtype=torch.int64, device=device)
        self.logits = torch.empty(batch, 1, c.vocab_size, dtype=logits_dtype, device=device)
        self.decode_binding = self.run_options = None  # made at the first decode step


class OrtFusedBackend(Backend):
    name = "ort-fused"
    owns_cpu_threads = True
    fused_greedy = True

    def __init__(self, onnx_path: Path, contract: Contract, precision: str, device: str | torch.device = "cpu",
                 n_positions: int = 1024):
        self.ort = import_ort()
        self.contract = Contract(contract.n_layer, contract.n_head, contract.head_dim, contract.vocab_size, ORT)
        self.precision, self.device, self.n_positions = precision, torch.device(device), n_positions
        self.vocab_size = contract.vocab_size
        self.capture = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if self.capture else None
        self.queued, self.done = (torch.cuda.Event(), torch.cuda.Event()) if self.capture else (None, None)
        self.session = open_session(onnx_path, self.contract, precision, self.device, fuse_qdq=True,
                                    cuda_options={"enable_cuda_graph": "1", "user_compute_stream": str(self.stream.cuda_stream)}
                                    if self.capture else None,
                                    session_config=CUDA_SESSION_CONFIG if self.capture else None)
        dtypes = io_dtypes(self.session)
        self.kv_dtype, self.logits_dtype = dtypes[self.contract.past_names[0]], dtypes[LOGITS]
        if self.capture and self.kv_dtype == torch.float32:
            raise BackendUnavailable(f"{onnx_path}: ONNX Runtime's GroupQueryAttention runs fp16 on CUDA, and this "
                                     "graph is fp32 (run the ort target's fp16 or int8-wo graph on a GPU)")
        self.prefill_options = self._options(NO_CAPTURE)
        self.caches: dict[tuple[int, int], SharedCache] = {}  # each shape keeps its buffers: a captured graph reads them
        self.cache: SharedCache | None = None

    def reset(self, batch: int, max_len: int) -> None:
        key = (batch, max_len)
        if key not in self.caches:
            if not self.capture:
                self.caches.clear()  # nothing captured reads the old buffers on a CPU
            self.caches[key] = SharedCache(self.contract, batch, max_len, self.kv_dtype, self.logits_dtype,
                                           self.device, graph_id=len(self.caches) + 1)
        self.cache = self.caches[key]
        self.cache.mask.zero_()

    @contextlib.contextmanager
    def _on_stream(self):
        """Run torch's and ONNX Runtime's work on the backend's stream, after what the caller queued, and
        make the caller's stream wait for it. Allocations made here are reused only by later calls,
        which start by waiting for the caller's stream: nothing the caller still reads is overwritten."""
        if self.stream is None:
            yield
            return
        caller = torch.cuda.current_stream(self.device)
        self.queued.record(caller)  # two events made once: a step records and waits, creates nothing
        self.stream.wait_event(self.queued)
        with torch.cuda.stream(self.stream):
            yield
        self.done.record(self.stream)
        caller.wait_event(self.done)

    def _options(self, graph_id: str):
        options = self.ort.RunOptions()
        if self.capture:
            options.add_run_config_entry("gpu_graph_id", graph_id)
        if self.device.type == "cuda":
            options.add_run_config_entry("disable_synchronize_execution_providers", "1")
        return options

    def _binding(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, logits: torch.Tensor,
                 kv: torch.Tensor, keep: torch.Tensor | None = None):
        """An IO binding by address: the tensors must outlive its runs. kv: [2L, B, H, T, D], past and present."""
        binding = self.session.io_binding()
        for name, tensor in zip(TOKEN_INPUTS, (input_ids, mask, positions)):
            bind(binding, name, tensor)
        for j, (past, present) in enumerate(zip(self.contract.past_names, self.contract.present_names)):
            bind(binding, past, kv[j])
            bind(binding, present, kv[j], output=True)
        if keep is not None:
            bind(binding, LOGITS_TO_KEEP, keep)
        bind(binding, LOGITS, logits, output=True)
        return binding

    def _prefill_rows(self, input_ids: torch.Tensor, kv: torch.Tensor, last_only: bool) -> torch.Tensor:
        """Prompts of one length into the cache rows `kv` -> logits [B, S or 1, V] in the graph's dtype."""
        rows, width = input_ids.shape
        mask, positions = unpadded_mask_and_positions(rows, width, self.device)
        keep = torch.tensor(1 if last_only else 0)  # the LM head over the last position, or all
        logits = torch.empty(rows, 1 if last_only else width, self.vocab_size, dtype=self.logits_dtype, device=self.device)
        input_ids = input_ids.contiguous()  # held here: the binding has only its address
        self.session.run_with_iobinding(self._binding(input_ids, mask, positions, logits, kv, keep), self.prefill_options)
        return logits

    def prefill(self, batch: Batch, last_only: bool = True) -> torch.Tensor:
        c = self.cache
        rows, width = batch.attention_mask.shape
        if width > c.max_len or rows != c.batch:
            raise ValueError(f"prefill of {rows} x {width} on a cache reset for {c.batch} x {c.max_len}")
        with self._on_stream():
            if not batch.padded:
                c.mask[:, :width] = 1
                return self._prefill_rows(batch.input_ids, c.kv, last_only).float()
            lengths = batch.attention_mask.sum(1).tolist()
            out = torch.zeros(rows, 1 if last_only else width, self.vocab_size, device=self.device)
            for row, length in enumerate(lengths):
                logits = self._prefill_rows(batch.input_ids[row:row + 1, width - length:], c.kv[:, row:row + 1], last_only)
                out[row, out.shape[1] - logits.shape[1]:] = logits[0]  # back in the runtime's left-padded columns
                c.mask[row, :length] = 1
            return out

    def _step(self) -> None:
        """One decode step of the tokens and positions in the cache's buffers (a CUDA graph replay on a GPU)."""
        c = self.cache
        c.mask.scatter_(1, c.positions, 1)  # a row's new token sits at its position: its cache slot
        if c.decode_binding is None:
            c.decode_binding = self._binding(c.tokens, c.mask, c.positions, c.logits, c.kv)
            c.run_options = self._options(c.graph_id)
        self.session.run_with_iobinding(c.decode_binding, c.run_options)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        with self._on_stream():
            self.cache.tokens.copy_(tokens)
            self.cache.positions.copy_(positions)
            self._step()
            return self.cache.logits[:, -1].float()

    def greedy_steps(self, token: torch.Tensor, position: torch.Tensor, count: int) -> Iterator[torch.Tensor]:
        """Each step's argmax, taken on the device from the graph's own logits, is the next step's token."""
        c = self.cache
        for i in range(count):
            with self._on_stream():
                if i == 0:
                    c.positions.copy_(position)
                else:
                    c.positions += 1
                c.tokens[:, 0] = token
                self._step()
                token = c.logits[:, -1].argmax(-1)
            yield token

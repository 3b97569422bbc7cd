"""onnxruntime-genai on the ort target's folder, unchanged (the graph, genai_config.json and the
tokenizer files export writes): the runtime a user who takes our export elsewhere would run.

onnxruntime-genai owns its cache and its search. A prefill appends the prompts and reads the last
position's logits; greedy decoding is its own loop (generate_next_token), so this backend offers
fused_greedy and the bench times onnxruntime-genai's generation, not ours. It appends tokens one
step at a time only for a single row (onnxruntime-genai takes one append per batch of several),
and pads on the right with end-of-text, so it takes prompts of one length."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from pipeline.cores import usable_cores
from pipeline.errors import UserError
from pipeline.runtime.backend import Backend, BackendUnavailable
from pipeline.runtime.batch import Batch
from pipeline.runtime.dynamic.ort_backend import cannot_load


class OrtGenaiBackend(Backend):
    name = "ort-genai"
    owns_cpu_threads = True
    fused_greedy = True
    max_rows = 32  # onnxruntime-genai's own bound on a generator's batch (kMaxBatchSize, src/generators.cpp)

    def __init__(self, folder: Path, precision: str, device: torch.device, n_positions: int, vocab_size: int):
        try:
            import onnxruntime_genai
        except ImportError:
            raise BackendUnavailable("onnxruntime-genai is not installed: pip install onnxruntime-genai") from None
        if device.type != "cpu":
            raise BackendUnavailable("the ort-genai row runs onnxruntime-genai's CPU package; its CUDA build is "
                                     "onnxruntime-genai-cuda, which this project has not run")
        try:  # the folder's genai_config.json is the user's to edit: a broken one is refused here, in one line
            config = onnxruntime_genai.Config(str(folder))
            # as the ort backends: the cores this process may run on (ONNX Runtime's default counts the host's)
            config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": usable_cores()}}}}))
            self.model = onnxruntime_genai.Model(config)
        except RuntimeError as e:  # onnxruntime-genai's type for a missing or unreadable config or graph
            raise cannot_load(folder, "onnxruntime-genai", e) from None
        self.og = onnxruntime_genai
        self.precision, self.device, self.n_positions, self.vocab_size = precision, device, n_positions, vocab_size
        self.generator = None

    def reset(self, batch: int, max_len: int) -> None:
        if batch > self.max_rows:
            raise UserError(f"onnxruntime-genai runs at most {self.max_rows} rows at once, not {batch}")
        self.params = self.og.GeneratorParams(self.model)
        self.params.set_search_options(max_length=max_len, batch_size=batch, do_sample=False)
        self.rows, self.generator = batch, None

    def prefill(self, batch: Batch, last_only: bool = True) -> torch.Tensor:
        if batch.padded:
            raise UserError("onnxruntime-genai pads prompts on the right with end-of-text: give it prompts of one length")
        if not last_only:
            raise ValueError("onnxruntime-genai returns the last position's logits only")
        self.generator = self.og.Generator(self.model, self.params)
        self.generator.append_tokens(batch.host_ids.numpy().astype(np.int32))
        return self._logits()[:, None]

    def _logits(self) -> torch.Tensor:
        return torch.from_numpy(np.asarray(self.generator.get_logits(), dtype=np.float32)).reshape(self.rows, -1)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.rows != 1:
            raise UserError("onnxruntime-genai appends tokens one step at a time to a single row only: "
                            "several prompts decode greedily")
        self.generator.append_tokens(tokens.cpu().numpy().astype(np.int32))
        return self._logits()

    def greedy_steps(self, token: torch.Tensor, position: torch.Tensor, count: int) -> Iterator[torch.Tensor]:
        self.generator.generate_next_token()  # its own pick from the prefill's logits: `token`, yielded already
        for step in range(count):
            # it ends a generation once every row has given end-of-text; a caller stopping there (its stop
            # tokens) never asks for more, one that ignores end-of-text cannot get it from this runtime
            if self.generator.is_done():
                raise ValueError(f"onnxruntime-genai ended the generation at end-of-text after {step + 1} tokens; "
                                 "it generates past end-of-text only up to its max_length, not on request")
            self.generator.generate_next_token()
            yield torch.from_numpy(np.asarray(self.generator.get_next_tokens(), dtype=np.int64))

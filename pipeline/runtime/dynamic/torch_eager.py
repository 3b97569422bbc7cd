"""The reference backend: the Hugging Face model itself, eager, with its own dynamic cache.
Every other backend is validated and benchmarked against this one."""

from __future__ import annotations

import torch
from transformers import DynamicCache, GPT2LMHeadModel

from pipeline.model import cache_keyword
from pipeline.precisions import torch_dtype
from pipeline.runtime.backend import Backend
from pipeline.runtime.batch import Batch, CacheMask


class TorchEagerBackend(Backend):
    name = "torch"

    def __init__(self, model: GPT2LMHeadModel, precision: str = "fp32", device: str | torch.device = "cpu"):
        self.precision, self.device = precision, torch.device(device)
        self.model = model.to(self.device, torch_dtype(precision)).eval()
        self.n_positions, self.vocab_size = model.config.n_positions, model.config.vocab_size
        self.cache_kw = cache_keyword(model)
        self.cache, self.mask, self.max_len = None, CacheMask(), 0

    def reset(self, batch: int, max_len: int) -> None:
        self.cache, self.max_len = DynamicCache(config=self.model.config), max_len

    @torch.inference_mode()
    def run(self, input_ids, attention_mask, position_ids, last_only: bool) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, logits_to_keep=int(last_only), **{self.cache_kw: self.cache})
        return out.logits.float()

    def prefill(self, batch: Batch, last_only: bool = True) -> torch.Tensor:
        self.mask.prefill(batch, self.max_len)
        return self.run(batch.input_ids, batch.attention_mask, batch.position_ids, last_only)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.run(tokens, self.mask.step(), positions, True)[:, -1]

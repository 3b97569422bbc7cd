"""The reference backend: the Hugging Face model itself, eager, with its own dynamic cache.
Every other backend is validated and benchmarked against this one."""

from __future__ import annotations

import torch
from transformers import DynamicCache, GPT2LMHeadModel

from pipeline.export.onnx_fp32 import cache_keyword

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class TorchEagerBackend:
    name = "torch"

    def __init__(self, model: GPT2LMHeadModel, precision: str = "fp32", device: str | torch.device = "cpu"):
        self.precision, self.device = precision, torch.device(device)
        self.model = model.to(self.device, TORCH_DTYPES[precision]).eval()
        self.n_positions, self.vocab_size = model.config.n_positions, model.config.vocab_size
        self.cache_kw = cache_keyword(model)
        self.cache = None

    def reset(self, batch: int, max_len: int) -> None:
        self.cache = DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def forward(self, input_ids, attention_mask, position_ids, last_only=False, padded=None):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, logits_to_keep=int(last_only), **{self.cache_kw: self.cache})
        return out.logits.float()

"""Inputs for the conversions that run the graph (fp16 AutoCast, int8 calibration) and for
Polygraphy's comparison: real decode steps, held-out tokens on top of a KV cache PyTorch computed."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.contract import Contract
from pipeline.export.onnx_fp32 import WithKVCache


def calibration_feeds(model, blocks: np.ndarray) -> dict[str, np.ndarray]:
    """Contract inputs for calibration: the first half of each held-out block becomes a real KV
    cache (computed by PyTorch), the second half the new tokens, so decode-time activation
    ranges (attention over a filled cache) are what gets calibrated."""
    contract = Contract.from_hf_config(model.config)
    batch, length = blocks.shape
    past = length // 2
    device = next(model.parameters()).device  # wherever the model is: validate may have moved it to a GPU
    empty = torch.zeros(batch, contract.n_head, 0, contract.head_dim, device=device)
    with torch.no_grad():
        out = WithKVCache(model)(torch.from_numpy(blocks[:, :past]).to(device),
                                 torch.ones(batch, past, dtype=torch.long, device=device),
                                 torch.arange(past, device=device).expand(batch, past), *[empty] * (2 * contract.n_layer))
    feeds = {"input_ids": blocks[:, past:], "attention_mask": np.ones((batch, length), np.int64),
             "position_ids": np.broadcast_to(np.arange(past, length), (batch, length - past)).copy()}
    feeds.update({name: t.float().cpu().numpy() for name, t in zip(contract.kv_names("past_key_values"), out[1:])})
    return feeds

"""The operations around StaticGPT2's products, as PyTorch ops: what torch.compile fuses in the
decode step, and the prefill of every static-cache backend but triton, whose fused kernels
(prefill_kernels.TritonOps) override them."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class TorchOps:
    """The elementwise work around the products, as PyTorch ops: what torch.compile fuses in the
    decode step, and the prefill of every backend but triton (prefill_kernels.TritonOps)."""

    # whether the residual products' biases are left out of the residual stream and added by each
    # layer norm instead (StaticGPT2.residual_biases): an ops class whose products add into the
    # stream in place can then skip writing the stream back in its layer norms
    defers_residual_biases = False

    @staticmethod
    def layer_norm(x: torch.Tensor, owed: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor,
                   eps: float) -> torch.Tensor:
        """layer_norm(x + owed): owed [C], where given, is what the residual stream x still lacks."""
        return F.layer_norm(x if owed is None else x + owed, x.shape[-1:], weight, bias, eps)

    @staticmethod
    def linear(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        return F.linear(h, w, b)

    @staticmethod
    def add_linear(x: torch.Tensor, a: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """The residual add of a product: x + a @ w^T (+ b)."""
        return x + F.linear(a, w, b)

    @staticmethod
    def embed_layer_norm(wte: torch.Tensor, wpe: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor,
                         weight: torch.Tensor, bias: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The first layer norm over the embedded input: (x, layer_norm(x)) for x = wte[ids] + wpe[positions]."""
        x = wte[ids] + wpe[positions]
        return x, TorchOps.layer_norm(x, None, weight, bias, eps)

    @staticmethod
    def causal_attention(qkv: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """A prefill from slot 0 without padding: the keys and values of qkv [B, S, 3C] into slots 0..S
        of the caches [B, H, T, D], and plain causal attention over them -> [B, S, C]."""
        batch, seq, width = qkv.shape
        _, heads, _, head_dim = keys.shape
        TorchOps.write_cache(qkv, keys, values, 0, None)
        q = qkv.view(batch, seq, 3, heads, head_dim)[:, :, 0].transpose(1, 2)  # [B, H, S, D]
        a = F.scaled_dot_product_attention(q, keys[:, :, :seq], values[:, :, :seq], is_causal=True)
        return a.transpose(1, 2).reshape(batch, seq, width // 3)

    @staticmethod
    def linear_gelu(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.gelu(F.linear(h, w, b), approximate="tanh")

    @staticmethod
    def write_cache(qkv: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: torch.Tensor | int,
                    slots: torch.Tensor | None) -> None:
        """The keys and values of qkv [B, S, 3C] into the caches [B, H, T, D] at slots (start.. start + S;
        slots, the same as a tensor, is read only where start is one)."""
        batch, seq, _ = qkv.shape
        _, heads, _, head_dim = keys.shape
        k, v = qkv.view(batch, seq, 3, heads, head_dim)[:, :, 1:].permute(2, 0, 3, 1, 4)  # [B, H, S, D] each
        if isinstance(start, int):  # a slice copy: index_copy_ from these strided views is 3x slower
            keys[:, :, start:start + seq].copy_(k)
            values[:, :, start:start + seq].copy_(v)
        else:
            keys.index_copy_(2, slots, k)
            values.index_copy_(2, slots, v)

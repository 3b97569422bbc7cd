"""Training mechanics shared by `finetune`, `train-bench` and `profile`: mixed precision, the
optimizer and its schedule, one optimizer step over accumulated micro-batches, and MFU."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel
from transformers import GPT2LMHeadModel

from pipeline.config import ModelConfig, TrainConfig
from pipeline.errors import UserError
from pipeline.train.distributed import Ranks, mean_over_ranks

# Dense bf16 tensor-core peak from the vendor's data sheets, in TFLOP/s: the MFU denominator.
PEAK_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1, "A10": 125.0, "L4": 121.0,
                    "RTX 4090": 165.2, "RTX 3090": 71.0}


def amp_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for plain fp32."""
    if precision == "auto":
        bf16_ok = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if bf16_ok else None
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def build_optimizer(model: torch.nn.Module, t: TrainConfig, device: torch.device,
                    sharded: bool = False) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not biases, LayerNorm or embeddings' rows twice);
    the fused kernel where the device has one (the foreach one for sharded parameters, as
    TorchTitan runs FSDP2)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = not sharded and device.type in ("cuda", "cpu")  # torch >= 2.4 has fused AdamW on both
    return torch.optim.AdamW(groups, lr=t.lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)


def lr_factor(t: TrainConfig) -> Callable[[int], float]:
    """Linear warm-up, then cosine or linear decay to min_lr_ratio (or constant)."""
    def factor(step: int) -> float:
        if step < t.warmup_steps:
            return (step + 1) / t.warmup_steps
        if t.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - t.warmup_steps) / max(1, t.steps - t.warmup_steps))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if t.schedule == "cosine" else 1 - progress
        return t.min_lr_ratio + (1 - t.min_lr_ratio) * shape
    return factor


def lm_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; x, y [B, T] (y is x shifted by one, already aligned)."""
    logits = model(input_ids=x, use_cache=False).logits  # [B, T, V]
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


def _enable_activation_checkpointing(model: GPT2LMHeadModel) -> None:
    """Recompute each block's activations in backward; the method was renamed in transformers 5.24."""
    kwargs = {"use_reentrant": False}  # the non-reentrant variant works with torch.compile and AMP
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


class Stepper:
    """One optimizer step over `grad_accum` micro-batches, with AMP, clipping and a GradScaler
    for fp16. Holds everything a resumed run must restore (optimizer, scheduler, scaler)."""

    def __init__(self, model: GPT2LMHeadModel, t: TrainConfig, device: torch.device, ranks: Ranks = Ranks()):
        self.module, self.t, self.device, self.ranks = model, t, device, ranks
        self.dtype = amp_dtype(t.precision, device)
        if t.checkpointing:
            _enable_activation_checkpointing(model)
        # FSDP2 shards each block's weights, gradients and optimizer state over the ranks (a world of
        # one included: the process group is then pipeline.train.distributed's group of one);
        # DistributedDataParallel keeps a whole copy per rank; both average the gradients in backward
        self.sharded = t.sharded
        if self.sharded:
            if self.dtype == torch.float16:
                raise UserError("train.parallel=fsdp trains in bf16 or fp32 (fp16's GradScaler is not sharded): "
                                "set train.precision=bf16")
            for block in model.transformer.h:
                fully_shard(block)
            self.model = fully_shard(model)
        else:
            self.model = model if ranks.world == 1 else DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None)
        self.loss_fn = torch.compile(lm_loss) if t.compile else lm_loss
        self.optimizer = build_optimizer(model, t, device, self.sharded)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor(t))
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.dtype == torch.float16)

    def step(self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> float:
        """Consume grad_accum micro-batches; return their mean loss (over every rank's)."""
        self.model.train()
        total = torch.zeros((), device=self.device)
        try:
            for i in range(self.t.grad_accum):
                x, y = (b.to(self.device, non_blocking=True) for b in next(batches))
                # gradients are averaged across ranks once, in the backward before the optimizer step
                last = i == self.t.grad_accum - 1
                if self.sharded:
                    self.model.set_requires_gradient_sync(last)
                with contextlib.nullcontext() if last or self.ranks.world == 1 or self.sharded else self.model.no_sync():
                    with autocast(self.device, self.dtype):
                        loss = self.loss_fn(self.model, x, y) / self.t.grad_accum
                    self.scaler.scale(loss).backward()
                total += loss.detach()
            if self.t.grad_clip > 0:
                self.scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.t.grad_clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            self.scheduler.step()
            mean_over_ranks(total, self.ranks)
        except torch.OutOfMemoryError:
            raise UserError(f"out of memory at train.batch_size={self.t.batch_size}: lower it (and raise "
                            "train.grad_accum to keep the effective batch), set train.checkpointing=true, "
                            "or use train.precision=bf16") from None
        return total.item()

    @torch.no_grad()
    def evaluate(self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> float:
        """Every rank evaluates the same batches on its own copy (no collective): the same loss."""
        self.module.eval()
        losses = []
        for x, y in batches:
            with autocast(self.device, self.dtype):
                losses.append(lm_loss(self.module, x.to(self.device), y.to(self.device)).item())
        return sum(losses) / len(losses)

    def weights(self) -> dict:
        """The model's whole weights. Sharded, every rank must call it (the shards are gathered) and
        rank 0 gets them, on the CPU."""
        if self.sharded:
            return get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return self.module.state_dict()

    def state(self) -> dict:
        """The scheduler's and scaler's state and, unsharded, the model's and optimizer's whole
        (sharded, those are save_shards()'s)."""
        state = {"scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict()}
        if not self.sharded:
            state |= {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}
        return state

    def save_shards(self, folder: Path) -> None:
        """Sharded: every rank writes its own shards of the weights and optimizer state into `folder`
        (torch.distributed.checkpoint), which a run at any rank count reads back."""
        model, optimizer = get_state_dict(self.module, self.optimizer)
        dcp.save({"model": model, "optimizer": optimizer}, checkpoint_id=folder)

    def load_state(self, state: dict, shards: Path) -> None:
        """What state() (and, sharded, save_shards() into `shards`) saved, back into the model and
        optimizer; sharded, each rank reads the pieces of its own shards, whatever the saving ranks."""
        if self.sharded:
            model, optimizer = get_state_dict(self.module, self.optimizer)
            saved = {"model": model, "optimizer": optimizer}
            dcp.load(saved, checkpoint_id=shards)
            set_state_dict(self.module, self.optimizer, model_state_dict=saved["model"],
                           optim_state_dict=saved["optimizer"])
        else:
            self.module.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])


TRAINING_BYTES_PER_PARAMETER = 16  # fp32 weights, their gradients and AdamW's two moments


def training_state_error(parameters: int, free: int | None, shards: int, resident: bool, device: str) -> str | None:
    """The one-line refusal of a fine-tune whose training state cannot fit before its first step,
    rather than the system killing it for memory at that step: weights, gradients and AdamW's moments
    take 16 bytes a parameter (split over the ranks under FSDP) before any activation; `resident`:
    the weights already in that memory (a model loaded where it trains). None where it fits or
    `free` is unknown."""
    needed = TRAINING_BYTES_PER_PARAMETER * parameters // shards - (4 * parameters // shards if resident else 0)
    if free is None or needed <= free:
        return None
    return (f"train.device={device}: the training state of {parameters / 1e6:,.0f}M parameters (fp32 weights, gradients and "
            f"AdamW's two moments, {TRAINING_BYTES_PER_PARAMETER} bytes a parameter) needs {needed / 2**30:.1f} GiB"
            f"{' beyond its loaded weights' if resident else ''} and {free / 2**30:.1f} GiB is free there; train on a GPU "
            "(--set train.device=cuda), shard it over more ranks (train.parallel=fsdp under torchrun), or pick a smaller --preset")


def flops_per_token(m: ModelConfig, n_params: int, seq: int) -> float:
    """Training FLOPs per token, PaLM appendix B: 6N for the weight matmuls (forward + backward,
    N counting the tied LM head once) plus 12·L·C·T for attention scores and values."""
    return 6 * n_params + 12 * m.n_layer * m.n_embd * seq


def peak_flops(device: torch.device) -> tuple[float | None, str]:
    """The device's dense bf16 peak in FLOP/s and its name, or None where no data sheet applies."""
    if device.type != "cuda":
        return None, "cpu"
    name = torch.cuda.get_device_name(device)
    for key, tflops in PEAK_BF16_TFLOPS.items():
        if key in name:
            return tflops * 1e12, name
    return None, name


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated device memory on a GPU; the process's peak resident set on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

"""The model: GPT-2 from a config (random init, offline) or from a pretrained checkpoint."""

from __future__ import annotations

import inspect
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoConfig, GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging

from pipeline.config import GPT2_VOCAB_SIZE, ModelConfig
from pipeline.errors import UserError


def resolve_device(spec: str, option: str = "train.device") -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise UserError(f"{option} {spec!r}: use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"{option} {spec!r}: no CUDA GPU is visible to torch; use cpu (or auto)")
    return device


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU): before and after a timed region."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def hf_config(m: ModelConfig) -> GPT2Config:
    return GPT2Config(n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd, n_positions=m.n_positions,
                      vocab_size=m.vocab_size, resid_pdrop=m.dropout, embd_pdrop=m.dropout, attn_pdrop=m.dropout,
                      bos_token_id=GPT2_VOCAB_SIZE - 1, eos_token_id=GPT2_VOCAB_SIZE - 1, tie_word_embeddings=True)


def new_model(m: ModelConfig, seed: int) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    return GPT2LMHeadModel(hf_config(m))


def shape_of(config: GPT2Config) -> ModelConfig:
    return ModelConfig(n_layer=config.n_layer, n_head=config.n_head, n_embd=config.n_embd,
                       n_positions=config.n_positions, vocab_size=config.vocab_size, dropout=config.resid_pdrop)


def load_gpt2(source: str | Path, what: str = "--model") -> GPT2LMHeadModel:
    """A GPT-2 from a hub id or local Hugging Face folder; anything else is refused by name."""
    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as e:
        raise UserError(f"{what} {source}: not a readable Hugging Face model ({str(e).splitlines()[0]})") from None
    if config.model_type != "gpt2":
        raise UserError(f"{what} {source}: a '{config.model_type}' model, but this pipeline takes GPT-2-shaped "
                        "models (model_type 'gpt2')")
    if config.vocab_size < GPT2_VOCAB_SIZE:
        raise UserError(f"{what} {source}: vocab_size {config.vocab_size} is smaller than GPT-2's tokenizer")
    hf_logging.disable_progress_bar()  # a bar per load is noise: checkpoints load in a blink
    try:
        return GPT2LMHeadModel.from_pretrained(source, dtype=torch.float32)
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:  # a truncated or empty weights file too
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"{what} {source}: the weights cannot be loaded ({reason}); rerun `gpt2-deploy finetune` "
                        "or restore the file") from None


def require_checkpoint(folder: Path, file: str = "config.json") -> Path:
    """folder / file, or a UserError that says how to make the checkpoint."""
    path = Path(folder) / file
    if not path.exists():
        raise UserError(f"{folder}: no checkpoint here; `gpt2-deploy finetune` (or `make finetune`) makes it")
    return path


def load_checkpoint(folder: Path) -> GPT2LMHeadModel:
    require_checkpoint(folder)
    return load_gpt2(folder, what="checkpoint").eval()


def cache_keyword(model: GPT2LMHeadModel) -> str:
    """`cache` from transformers 5.24, `past_key_values` before it."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

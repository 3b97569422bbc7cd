"""Typed configuration: presets, a TOML file, then `--set section.key=value` overrides.

Every stage reads one `Config`. Presets give the model shape and sensible training settings
(`tiny` runs the whole pipeline on a 2-core CPU in minutes; `gpt2` is the 124M shape). A TOML file
overrides a preset section by section, and `--set` overrides single keys last.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import tomllib

from pipeline.contract import TARGETS
from pipeline.errors import UserError
from pipeline.precisions import PRECISIONS, Budget

GPT2_VOCAB_SIZE = 50257  # GPT-2's byte-level BPE; the embedded tokenizer has exactly this many


@dataclass
class ModelConfig:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    n_positions: int = 1024  # the context limit: prompt + generated tokens never exceed it
    vocab_size: int = GPT2_VOCAB_SIZE
    dropout: float = 0.0  # fine-tuning from random init on little text overfits less slowly without it


@dataclass
class DataConfig:
    source: str = ""  # "" = the embedded corpus; else a text file, a folder of text files, or `hf:NAME`
    block_size: int = 1024  # tokens per packed training block
    heldout_every: int = 20  # every Nth document goes to the held-out split
    calib_samples: int = 64  # held-out blocks used to calibrate int8 (and fp16 AutoCast) export
    calib_block_size: int = 128


@dataclass
class TrainConfig:
    steps: int = 2000  # optimizer steps
    batch_size: int = 16  # blocks per micro-batch
    grad_accum: int = 4  # micro-batches per optimizer step
    lr: float = 6e-4
    min_lr_ratio: float = 0.1  # the schedule decays to lr * min_lr_ratio
    warmup_steps: int = 100
    schedule: str = "cosine"  # cosine | linear | constant
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # 0 disables clipping
    precision: str = "auto"  # auto (bf16 where supported, else fp32) | fp32 | bf16 | fp16
    checkpointing: bool = False  # activation checkpointing: recompute block activations in backward
    compile: bool = False  # torch.compile the model
    parallel: str = "ddp"  # across ranks (torchrun): ddp (a whole copy per rank) | fsdp (FSDP2, weights and optimizer sharded)
    eval_interval: int = 200  # steps between held-out evaluations
    eval_batches: int = 20  # micro-batches per intermediate evaluation (the final one uses all)
    save_interval: int = 200  # steps between resumable training-state saves
    log_interval: int = 10
    num_workers: int = 2
    seed: int = 1337
    device: str = "auto"  # auto | cpu | cuda | cuda:N

    @property
    def sharded(self) -> bool:
        """FSDP: weights and optimizer state sharded over the ranks, a world of one included."""
        return self.parallel == "fsdp"


@dataclass
class ExportConfig:
    opset: int = 18
    precisions: list[str] = field(default_factory=lambda: list(PRECISIONS))
    # portable: standard ONNX (TensorRT builds from it); ort: ONNX Runtime's fused operators, a shared
    # KV buffer, and an onnxruntime-genai folder (pipeline/contract.py)
    targets: list[str] = field(default_factory=lambda: list(TARGETS))
    parity_prompts: int = 4  # held-out prompts run through ONNX Runtime after each export
    parity_tokens: int = 8  # greedy tokens compared in the post-export parity check


@dataclass
class EngineConfig:
    """TensorRT optimisation profile (one profile serves prefill and decode) and build settings."""
    min_batch: int = 1
    opt_batch: int = 1
    max_batch: int = 64
    opt_seq: int = 1  # decode is the hot path: tune kernels for one new token
    max_seq: int = 512  # the longest prompt one prefill takes
    max_len: int = 1024  # past + new tokens; at most model.n_positions
    opt_len: int = 256
    # TensorRT-RTX compute capabilities, e.g. sm86,sm89; [] = this GPU, or sm86 without one
    targets: list[str] = field(default_factory=list)
    optimization_level: int = 3  # builder optimisation level 0-5: higher searches longer for faster kernels
    workspace_gib: float = 16.0  # tactic scratch space; 4 GiB made the 124M build run out on an H200


@dataclass
class ServeConfig:
    """`gpt2-deploy serve`'s limits; its flags override them."""
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = ""  # the model id /v1 answers to; "" = the run's name
    max_rows: int = 64  # prompts decoded at once, all requests together (continuous batching)
    max_prompts: int = 64  # prompts in one request
    queue: int = 64  # requests waiting to start beyond this many get 429
    timeout_s: float = 120.0  # a request still running after this is stopped (504)
    max_body: int = 1 << 20  # request bodies over this many bytes get 413
    body_timeout_s: float = 10.0  # a body whose next part takes longer than this to arrive gets 408
    header_timeout_s: float = 10.0  # a request line and headers not whole this long after they began: 408, closed
    drain_s: float = 30.0  # on SIGTERM, how long requests in flight may still run before the server exits
    # HTTP processes in front of the one engine; 0: 8 with a GPU, at most half the cores (one event loop
    # was the limit there, docs/journal/performance.md), 1 on a CPU
    http_processes: int = 0


def _default_budgets() -> dict[str, Budget]:
    return {name: dataclasses.replace(p.budget) for name, p in PRECISIONS.items()}


@dataclass
class ValidateConfig:
    prompts: int = 8  # held-out prompts for logits and greedy comparisons
    prompt_tokens: int = 32
    new_tokens: int = 32
    perplexity_blocks: int = 16  # held-out blocks of data.calib_block_size for perplexity
    budgets: dict[str, Budget] = field(default_factory=_default_budgets)


@dataclass
class Config:
    preset: str = "gpt2"
    run: str = ""  # run folder name under artifacts/; "" = the preset's name
    model_source: str = ""  # "" = random init from [model]; else a hub id or a local HF folder
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    validate: ValidateConfig = field(default_factory=ValidateConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)

    @property
    def run_name(self) -> str:
        return self.run or self.preset

    def section(self, name: str) -> dict[str, Any]:
        return dataclasses.asdict(getattr(self, name))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # The 124M GPT-2 shape, trained the way nanoGPT trains it.
    "gpt2": {},
    # The published larger shapes (355M, 774M, 1.5B), fine-tuned at a lower rate, with smaller
    # micro-batches (more accumulation: the same 64-block step) and activation checkpointing past 124M.
    "gpt2-medium": {"model": {"n_layer": 24, "n_head": 16, "n_embd": 1024},
                    "train": {"lr": 3e-4, "batch_size": 8, "grad_accum": 8, "checkpointing": True}},
    "gpt2-large": {"model": {"n_layer": 36, "n_head": 20, "n_embd": 1280},
                   "train": {"lr": 2.5e-4, "batch_size": 8, "grad_accum": 8, "checkpointing": True}},
    "gpt2-xl": {"model": {"n_layer": 48, "n_head": 25, "n_embd": 1600},
                "train": {"lr": 2e-4, "batch_size": 4, "grad_accum": 16, "checkpointing": True}},
    # A few layers with GPT-2's real vocabulary: the whole pipeline in minutes on 2 CPU cores.
    "tiny": {
        "model": {"n_layer": 2, "n_head": 4, "n_embd": 128, "n_positions": 256},
        "data": {"block_size": 128, "calib_samples": 16, "calib_block_size": 64},
        "engine": {"max_batch": 8, "max_seq": 128, "max_len": 256, "opt_len": 64},
        "train": {"steps": 150, "batch_size": 16, "grad_accum": 1, "lr": 2e-3, "warmup_steps": 15,
                  "eval_interval": 50, "eval_batches": 8, "save_interval": 50, "log_interval": 5,
                  "num_workers": 1},
    },
}

CHOICES = {
    ("train", "schedule"): ("cosine", "linear", "constant"),
    ("train", "precision"): ("auto", "fp32", "bf16", "fp16"),
    ("train", "parallel"): ("ddp", "fsdp"),
}


def _merge_into(obj: Any, values: dict[str, Any], source: str, path: str = "") -> None:
    """Set dataclass fields from a (nested) dict, converting and type-checking each value. Errors
    name the source (a preset, a file, a --set option) and the key's dotted path apart."""
    hints = get_type_hints(type(obj))
    for key, value in values.items():
        where = f"{path}{key}"
        if key not in hints:
            raise UserError(f"{source}: unknown key '{where}' (known here: {', '.join(hints)})")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current) or isinstance(current, dict):
            if not isinstance(value, dict):
                raise UserError(f"{source}: {where} is a table of settings, not {_shown(value)}")
            if isinstance(current, dict):  # a table of dataclasses keyed by name (budgets per precision)
                for name, entry in value.items():
                    if name not in current:
                        raise UserError(f"{source}: unknown entry '{where}.{name}' (known: {', '.join(current)})")
                    _merge_into(current[name], entry, source, f"{where}.{name}.")
            else:
                _merge_into(current, value, source, f"{where}.")
        else:
            setattr(obj, key, _coerce(value, hints[key], source, where))


def _coerce(value: Any, hint: Any, source: str, where: str) -> Any:
    """Accept TOML values and `--set` strings alike; floats must be finite."""
    origin = get_origin(hint)
    try:
        if origin is list:
            (item,) = get_args(hint)
            if isinstance(value, str):
                value = [v for v in value.split(",") if v]
            return [_coerce(v, item, source, where) for v in value]
        if hint is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            if not isinstance(value, bool):
                raise ValueError(value)
            return value
        if hint in (int, float) and isinstance(value, bool):
            raise ValueError(value)
        if hint is int and isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        converted = hint(value)
        if hint is float and not math.isfinite(converted):
            raise UserError(f"{source}: {where} = {_shown(value)} is not a finite number")
        return converted
    except (TypeError, ValueError):
        raise UserError(f"{source}: {where} = {_shown(value)} is not a valid {getattr(hint, '__name__', hint)}") from None


def _shown(value: Any, limit: int = 60) -> str:
    """A value as an error line quotes it: whole when short, its head and length when not (a 3 MB string
    was echoed whole)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _parse_override(text: str) -> tuple[list[str], str]:
    if "=" not in text:
        raise UserError(f"--set {text!r}: expected SECTION.KEY=VALUE, e.g. --set train.lr=3e-4")
    key, value = text.split("=", 1)
    return key.strip().split("."), value.strip()


def load_config(preset: str = "tiny", file: Path | None = None, overrides: list[str] | None = None,
                **top_level: Any) -> Config:
    """Preset, then TOML file, then `--set` overrides, then explicit top-level keyword values."""
    if preset not in PRESETS:
        raise UserError(f"--preset {preset!r} is unknown; choose one of: {', '.join(PRESETS)}")
    cfg = Config(preset=preset)
    _merge_into(cfg, PRESETS[preset], f"--preset {preset}")
    if file is not None:
        if not file.is_file():
            raise UserError(f"--config {file}: no such file")
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"--config {file}: not valid TOML ({e})") from None
        data.pop("preset", None)  # the preset is chosen before the file is applied
        _merge_into(cfg, data, str(file))
    for text in overrides or []:
        path, value = _parse_override(text)
        nested: dict[str, Any] = {path[-1]: value}
        for part in reversed(path[:-1]):
            nested = {part: nested}
        _merge_into(cfg, nested, f"--set {text if len(text) <= 80 else _shown(text)}")
    if top_level.get("run") == "":  # left out, --run is the preset's name; given empty, it is a mistake
        raise UserError("--run '': give a run name, or leave --run out for the preset's name")
    for key, value in top_level.items():
        if value is not None:
            _merge_into(cfg, {key: value}, {"model_source": "--model"}.get(key, f"--{key}"))
    validate_config(cfg)
    return cfg


RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_run_name(name: str) -> None:
    """A run folder is one plain name under --artifacts: no path, so no run can write outside it."""
    if not RUN_NAME.fullmatch(name) or name.endswith(".tmp") or len(name) > 128:
        raise UserError(f"--run {name!r}: a run name is one folder name of letters, digits, '.', '_' and '-' "
                        "(no '/', no '..'); choose another")


def validate_config(cfg: Config) -> None:
    """Reject values that would fail later, or silently train nonsense, with the option to fix."""
    m, d, t, e, v = cfg.model, cfg.data, cfg.train, cfg.export, cfg.validate
    check_run_name(cfg.run_name)
    checks = [
        (m.n_layer >= 1, "model.n_layer must be at least 1"),
        (m.n_head >= 1 and m.n_embd % m.n_head == 0,
         f"model.n_embd ({m.n_embd}) must be a positive multiple of model.n_head ({m.n_head})"),
        (m.vocab_size >= GPT2_VOCAB_SIZE,
         f"model.vocab_size ({m.vocab_size}) must cover the GPT-2 tokenizer's {GPT2_VOCAB_SIZE} tokens"),
        (0.0 <= m.dropout < 1.0, "model.dropout must be in [0, 1)"),
        (1 < d.block_size <= m.n_positions,
         f"data.block_size ({d.block_size}) must be in (1, model.n_positions={m.n_positions}]"),
        (1 < d.calib_block_size <= m.n_positions,
         f"data.calib_block_size ({d.calib_block_size}) must be in (1, model.n_positions={m.n_positions}]"),
        (d.heldout_every >= 2, "data.heldout_every must be at least 2"),
        (d.calib_samples >= 1, "data.calib_samples must be at least 1"),
        (t.steps >= 1, "train.steps must be at least 1"),
        (t.batch_size >= 1, "train.batch_size must be at least 1"),
        (t.grad_accum >= 1, "train.grad_accum must be at least 1"),
        (t.lr > 0, f"train.lr must be positive, got {t.lr}"),
        (0.0 <= t.min_lr_ratio <= 1.0, "train.min_lr_ratio must be in [0, 1]"),
        (0 <= t.warmup_steps <= t.steps, f"train.warmup_steps must be in [0, train.steps={t.steps}]"),
        (t.weight_decay >= 0, "train.weight_decay must not be negative"),
        (t.grad_clip >= 0, "train.grad_clip must not be negative (0 disables it)"),
        (t.eval_interval >= 1 and t.save_interval >= 1 and t.log_interval >= 1,
         "train.eval_interval, save_interval and log_interval must be at least 1"),
        (t.eval_batches >= 1, "train.eval_batches must be at least 1"),
        (t.num_workers >= 0, "train.num_workers must not be negative"),
        (t.device == "auto" or t.device == "cpu" or t.device.startswith("cuda"),
         f"train.device {t.device!r}: use auto, cpu, cuda or cuda:N"),
        (e.opset >= 18, "export.opset must be 18 or newer (the dynamo exporter's minimum)"),
        (bool(e.precisions) and all(p in PRECISIONS for p in e.precisions),
         f"export.precisions {e.precisions}: choose from {', '.join(PRECISIONS)}"),
        (bool(e.targets) and all(t in TARGETS for t in e.targets),
         f"export.targets {e.targets}: choose from {', '.join(TARGETS)}"),
        (e.parity_prompts >= 1 and e.parity_tokens >= 1, "export.parity_prompts and parity_tokens must be at least 1"),
        (v.prompts >= 1 and v.new_tokens >= 1 and v.perplexity_blocks >= 1,
         "validate.prompts, new_tokens and perplexity_blocks must be at least 1"),
        (1 <= v.prompt_tokens and v.prompt_tokens + v.new_tokens <= m.n_positions,
         f"validate.prompt_tokens + validate.new_tokens must fit in model.n_positions={m.n_positions}"),
    ]
    g = cfg.engine
    checks += [
        (1 <= g.min_batch <= g.opt_batch <= g.max_batch,
         f"engine batch profile: need 1 <= min_batch ({g.min_batch}) <= opt_batch ({g.opt_batch}) <= max_batch ({g.max_batch})"),
        (1 <= g.opt_seq <= g.max_seq <= g.max_len,
         f"engine seq profile: need 1 <= opt_seq ({g.opt_seq}) <= max_seq ({g.max_seq}) <= max_len ({g.max_len})"),
        (g.opt_len <= g.max_len <= m.n_positions,
         f"engine.max_len ({g.max_len}) must be in [opt_len ({g.opt_len}), model.n_positions ({m.n_positions})]"),
        (0 <= g.optimization_level <= 5, "engine.optimization_level must be in 0..5"),
        (g.workspace_gib > 0, "engine.workspace_gib must be positive"),
        (all(re.fullmatch(r"sm\d{2,3}", t) for t in g.targets), f"engine.targets {g.targets}: use names like sm86,sm89,sm120"),
    ]
    sv = cfg.serve
    checks += [
        (1 <= sv.port <= 65535, f"serve.port {sv.port}: use 1-65535"),
        (sv.max_rows >= 1 and sv.max_prompts >= 1 and sv.queue >= 1,
         "serve.max_rows, max_prompts and queue must be at least 1"),
        (sv.http_processes >= 0, f"serve.http_processes {sv.http_processes}: use 0 (by the device) or more"),
        (sv.timeout_s > 0 and sv.drain_s >= 0, "serve.timeout_s must be positive and serve.drain_s not negative"),
        (sv.max_body >= 1024, "serve.max_body must be at least 1024 bytes"),
        (sv.body_timeout_s > 0 and sv.header_timeout_s > 0, "serve.body_timeout_s and header_timeout_s must be positive"),
    ]
    for name, b in v.budgets.items():
        checks.append((b.max_rel_error >= 0 and b.max_perplexity_change >= 0 and 0 <= b.min_top1_clear <= 1
                       and 0 <= b.min_greedy_identical <= 1,
                       f"validate.budgets.{name}: errors must be >= 0 and shares in [0, 1]"))
    for (section, key), allowed in CHOICES.items():
        value = getattr(getattr(cfg, section), key)
        checks.append((value in allowed, f"{section}.{key} {value!r}: choose one of {', '.join(allowed)}"))
    for ok, message in checks:
        if not ok:
            raise UserError(message)

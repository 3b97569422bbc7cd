"""`gpt2-deploy train-bench`: training-step throughput, peak memory and MFU of the training
settings side by side, in one process on one GPU (synthetic tokens: speed does not depend on them).

Each setting gets a fresh model; compile and warm-up steps are timed apart from the measured steps."""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time

import torch
from rich.table import Table

from pipeline.artifacts import atomic_write_json
from pipeline.config import Config
from pipeline.errors import UserError
from pipeline.model import new_model, resolve_device
from pipeline.progress import console
from pipeline.training import Stepper, flops_per_token, peak_flops

# name -> (precision, activation checkpointing, torch.compile)
SETTINGS = {
    "fp32": ("fp32", False, False),
    "amp-bf16": ("bf16", False, False),
    "amp-bf16+ckpt": ("bf16", True, False),
    "amp-bf16+compile": ("bf16", False, True),
    "amp-bf16+ckpt+compile": ("bf16", True, True),
}


def measured_matmul_peak(device: torch.device, n: int = 8192, reps: int = 20) -> float:
    """FLOP/s of a large bf16 matmul: the practical ceiling MFU is also reported against."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize(device)
    return 2 * n**3 * reps / (time.perf_counter() - start)


def _synthetic_batches(batch: int, seq: int, vocab: int, device: torch.device):
    x = torch.randint(0, vocab, (batch, seq + 1), device=device)
    while True:
        yield x[:, :-1], x[:, 1:]


def bench_setting(cfg: Config, name: str, device: torch.device, warmup: int, steps: int) -> dict:
    precision, ckpt, compiled = SETTINGS[name]
    t = dataclasses.replace(cfg.train, precision=precision, checkpointing=ckpt, compile=compiled, grad_accum=1)
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    model = new_model(cfg.model, t.seed).to(device)
    stepper = Stepper(model, t, device)
    batches = _synthetic_batches(t.batch_size, cfg.data.block_size, cfg.model.vocab_size, device)
    start = time.perf_counter()
    for _ in range(warmup):
        stepper.step(batches)
    torch.cuda.synchronize(device)
    warmup_s = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        stepper.step(batches)  # .item() inside synchronises
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    tokens_per_s = t.batch_size * cfg.data.block_size / step_s
    n_params = sum(p.numel() for p in model.parameters())
    flops = tokens_per_s * flops_per_token(cfg.model, n_params, cfg.data.block_size)
    result = {"setting": name, "step_ms": step_s * 1e3, "tokens_per_s": tokens_per_s, "achieved_tflops": flops / 1e12,
              "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30, "warmup_s": warmup_s}
    del model, stepper
    return result


def train_bench(cfg: Config, settings: list[str], warmup: int = 3, steps: int = 10) -> dict:
    device = resolve_device(cfg.train.device)
    if device.type != "cuda":
        raise UserError("train-bench measures GPU training throughput; no CUDA device is visible (see `gpt2-deploy doctor`)")
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        raise UserError(f"--settings {','.join(unknown)}: unknown; choose from {', '.join(SETTINGS)}")
    peak, gpu = peak_flops(device)
    measured = measured_matmul_peak(device)
    rows = []
    for name in settings:
        console.print(f"train-bench: {name} ...")
        try:
            row = bench_setting(cfg, name, device, warmup, steps)
        except UserError as e:  # out of memory in one setting should not lose the others
            row = {"setting": name, "error": str(e)}
        if "error" not in row:
            row["mfu_datasheet"] = row["achieved_tflops"] * 1e12 / peak if peak else None
            row["mfu_measured_matmul"] = row["achieved_tflops"] * 1e12 / measured
        rows.append(row)
    return {"gpu": gpu, "torch": torch.__version__, "batch_size": cfg.train.batch_size, "block_size": cfg.data.block_size,
            "datasheet_bf16_tflops": peak / 1e12 if peak else None, "measured_bf16_matmul_tflops": measured / 1e12,
            "warmup_steps": warmup, "timed_steps": steps, "rows": rows}


def report(result: dict, run) -> None:
    """train_bench.json into the run's reports, and the table on the console."""
    atomic_write_json(run.reports / "train_bench.json", result)
    table = Table(title=f"training step, {result['gpu']}, batch {result['batch_size']} x {result['block_size']} tokens")
    for col in ("setting", "tokens/s", "step ms", "peak GiB", "MFU (datasheet)", "MFU (measured matmul)", "warm-up s"):
        table.add_column(col, justify="left" if col == "setting" else "right")
    pct = lambda v: f"{100 * v:.1f}%" if v is not None else "n/a"  # noqa: E731
    for r in result["rows"]:
        if "error" in r:
            table.add_row(r["setting"], r["error"], *[""] * 5)
            continue
        table.add_row(r["setting"], f"{r['tokens_per_s']:,.0f}", f"{r['step_ms']:.1f}", f"{r['peak_memory_gib']:.2f}",
                      pct(r["mfu_datasheet"]), pct(r["mfu_measured_matmul"]), f"{r['warmup_s']:.1f}")
    console.print(table)

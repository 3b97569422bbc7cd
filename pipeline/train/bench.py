"""`gpt2-deploy train-bench`: training-step throughput, peak memory and MFU of the training
settings side by side (synthetic tokens: speed does not depend on them), on one device, or on
several ranks under torchrun (`--nproc N`, DistributedDataParallel or FSDP2 as finetune runs them)
with the scaling efficiency: the ranks' tokens/s over N times rank 0's alone, measured first in the
same launch.

Each setting gets a fresh model; compile and warm-up steps are timed apart from the measured steps.
On a CPU there is no data-sheet peak, so no MFU."""

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
from pipeline.model import new_model, resolve_device, synchronize
from pipeline.progress import console
from pipeline.train.distributed import Ranks, barrier, process_group, rank_device
from pipeline.train.stepper import Stepper, flops_per_token, peak_flops, peak_memory_bytes

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


def bench_setting(cfg: Config, name: str, device: torch.device, warmup: int, steps: int,
                  ranks: Ranks = Ranks()) -> dict:
    """One setting on these ranks: tokens/s over all of them (each steps its own micro-batch)."""
    precision, ckpt, compiled = SETTINGS[name]
    t = dataclasses.replace(cfg.train, precision=precision, checkpointing=ckpt, compile=compiled, grad_accum=1)
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    model = new_model(cfg.model, t.seed).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    stepper = Stepper(model, t, device, ranks)
    batches = _synthetic_batches(t.batch_size, cfg.data.block_size, cfg.model.vocab_size, device)
    start = time.perf_counter()
    for _ in range(warmup):
        stepper.step(batches)
    synchronize(device)
    warmup_s = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        stepper.step(batches)  # .item() inside synchronises
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    tokens_per_s = ranks.world * t.batch_size * cfg.data.block_size / step_s
    flops = tokens_per_s * flops_per_token(cfg.model, n_params, cfg.data.block_size)
    result = {"setting": name, "world": ranks.world, "step_ms": step_s * 1e3, "tokens_per_s": tokens_per_s,
              "achieved_tflops": flops / 1e12, "peak_memory_gib": peak_memory_bytes(device) / 2**30, "warmup_s": warmup_s}
    del model, stepper
    return result


def _bench_on_ranks(cfg: Config, name: str, device: torch.device, warmup: int, steps: int, ranks: Ranks) -> dict:
    """Rank 0 alone first (the others wait), then every rank together: the scaling efficiency."""
    # rank 0 alone trains a whole copy: an FSDP mesh would span every rank of the group
    alone = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, parallel="ddp"))
    single = bench_setting(alone, name, device, warmup, steps) if ranks.main else None
    barrier(ranks)
    row = bench_setting(cfg, name, device, warmup, steps, ranks)
    if single is not None:
        row["single_tokens_per_s"] = single["tokens_per_s"]
        row["scaling_efficiency"] = row["tokens_per_s"] / (ranks.world * single["tokens_per_s"])
    return row


def train_bench(cfg: Config, settings: list[str], warmup: int = 3, steps: int = 10, ranks: Ranks = Ranks()) -> dict:
    """The report (rank 0's; other ranks get theirs without the single-rank figures)."""
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        raise UserError(f"--settings {','.join(unknown)}: unknown; choose from {', '.join(SETTINGS)}")
    device = rank_device(resolve_device(cfg.train.device), ranks)
    peak, hardware = peak_flops(device)
    measured = measured_matmul_peak(device) if device.type == "cuda" else None
    rows = []
    with process_group(ranks, device, cfg.train.sharded):
        for name in settings:
            if ranks.main:
                console.print(f"train-bench: {name} on {ranks.world} rank{'s' if ranks.world > 1 else ''} ...")
            try:
                row = (_bench_on_ranks(cfg, name, device, warmup, steps, ranks) if ranks.world > 1
                       else bench_setting(cfg, name, device, warmup, steps))
            except UserError as e:  # out of memory in one setting should not lose the others
                row = {"setting": name, "error": str(e)}
            if "error" not in row:
                per_device = row["achieved_tflops"] * 1e12 / ranks.world
                row["mfu_datasheet"] = per_device / peak if peak else None
                row["mfu_measured_matmul"] = per_device / measured if measured else None
            rows.append(row)
    return {"gpu": hardware, "torch": torch.__version__, "world": ranks.world, "batch_size_per_rank": cfg.train.batch_size,
            "block_size": cfg.data.block_size, "datasheet_bf16_tflops": peak / 1e12 if peak else None,
            "measured_bf16_matmul_tflops": measured / 1e12 if measured else None,
            "warmup_steps": warmup, "timed_steps": steps, "rows": rows}


def report(result: dict, run) -> None:
    """train_bench.json into the run's reports, and the table on the console."""
    atomic_write_json(run.reports / "train_bench.json", result)
    world = result["world"]
    table = Table(title=f"training step, {result['gpu']} x {world}, batch {result['batch_size_per_rank']} x "
                        f"{result['block_size']} tokens per rank")
    columns = ["setting", "tokens/s", "step ms", "peak GiB", "MFU (datasheet)", "MFU (measured matmul)", "warm-up s"]
    if world > 1:
        columns[2:2] = ["rank 0 alone", "scaling"]
    for col in columns:
        table.add_column(col, justify="left" if col == "setting" else "right")
    pct = lambda v: f"{100 * v:.1f}%" if v is not None else "n/a"  # noqa: E731
    for r in result["rows"]:
        if "error" in r:
            table.add_row(r["setting"], r["error"], *[""] * (len(columns) - 2))
            continue
        scaling = [f"{r['single_tokens_per_s']:,.0f}", pct(r["scaling_efficiency"])] if world > 1 else []
        table.add_row(r["setting"], f"{r['tokens_per_s']:,.0f}", *scaling, f"{r['step_ms']:.1f}",
                      f"{r['peak_memory_gib']:.2f}", pct(r["mfu_datasheet"]), pct(r["mfu_measured_matmul"]),
                      f"{r['warmup_s']:.1f}")
    console.print(table)

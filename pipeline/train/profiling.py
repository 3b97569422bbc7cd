"""`gpt2-deploy profile`: a PyTorch profiler trace of a few training steps and a top-ops table,
which is where finding a training bottleneck starts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader

from pipeline.artifacts import RunDir, atomic_dir
from pipeline.config import Config
from pipeline.data import PackedBlocks, ResumableSampler, prepare_data
from pipeline.model import new_model, resolve_device
from pipeline.progress import console, progress
from pipeline.tokenizer import embedded_gpt2_tokenizer
from pipeline.train.stepper import Stepper

WAIT, WARMUP = 1, 1  # profiler schedule: skip one step, warm up on one, then record


def profile_training(cfg: Config, run: RunDir, steps: int = 3, rows: int = 15) -> Path:
    """Record `steps` training steps; returns the folder with trace.json and top_ops.txt."""
    run.ensure_writable()
    splits = prepare_data(cfg, run, embedded_gpt2_tokenizer())
    device = resolve_device(cfg.train.device)
    model = new_model(cfg.model, cfg.train.seed).to(device)
    t = dataclasses.replace(cfg.train, grad_accum=1, parallel="ddp")  # one process, one whole copy
    stepper = Stepper(model, t, device)
    dataset = PackedBlocks(splits.train, cfg.data.block_size)
    batches = iter(DataLoader(dataset, batch_size=t.batch_size, sampler=ResumableSampler(len(dataset), t.seed)))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort_key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    with atomic_dir(run.reports / "profile") as tmp:
        with profile(activities=activities, schedule=schedule(wait=WAIT, warmup=WARMUP, active=steps),
                     record_shapes=True, profile_memory=True) as prof:
            for _ in progress(range(WAIT + WARMUP + steps), total=WAIT + WARMUP + steps, description="profile"):
                stepper.step(batches)
                prof.step()
        prof.export_chrome_trace(str(tmp / "trace.json"))
        table = prof.key_averages().table(sort_by=sort_key, row_limit=rows)
        (tmp / "top_ops.txt").write_text(table + "\n", encoding="utf-8")
    console.print(table)
    console.print(f"profile: open {run.reports / 'profile' / 'trace.json'} in chrome://tracing or https://ui.perfetto.dev")
    return run.reports / "profile"

"""The `gpt2-deploy` command: one subcommand per stage, each a thin layer over a plain function."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from pipeline.artifacts import ARTIFACTS_ROOT, RunDir, atomic_write_json
from pipeline.config import PRESETS, Config, load_config, validate_config
from pipeline.errors import Interrupted, UserError
from pipeline.progress import console

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="GPT-2 from PyTorch to validated, benchmarked ONNX Runtime and TensorRT engines.")
_debug = {"on": False}

Preset = Annotated[str, typer.Option(help=f"Model shape and settings: {', '.join(PRESETS)}.")]
ConfigFile = Annotated[Optional[Path], typer.Option("--config", help="TOML file overriding the preset.")]
Sets = Annotated[Optional[list[str]], typer.Option("--set", help="Override one key, e.g. --set train.lr=3e-4 (repeatable).")]
RunName = Annotated[Optional[str], typer.Option("--run", help="Run folder name under --artifacts (default: the preset).")]
Artifacts = Annotated[Path, typer.Option("--artifacts", help="Folder that holds the run folders.")]
Force = Annotated[bool, typer.Option("--force", help="Redo the stage even if its outputs are up to date.")]


@app.callback()
def main(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False) -> None:
    _debug["on"] = debug


def user_errors(fn):
    """Print a UserError as one line and exit non-zero; keep tracebacks for --debug and for bugs."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            if _debug["on"]:
                raise
            console.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
            raise typer.Exit(130 if isinstance(e, Interrupted) else 1) from None
    return wrapper


def _setup(preset: str, config: Optional[Path], sets: Optional[list[str]], run: Optional[str], artifacts: Path,
           **top_level) -> tuple[Config, RunDir]:
    cfg = load_config(preset, config, sets, run=run, **top_level)
    return cfg, RunDir(artifacts / cfg.run_name)


@app.command()
@user_errors
def finetune(preset: Preset = "tiny", config: ConfigFile = None, sets: Sets = None, run: RunName = None,
             artifacts: Artifacts = ARTIFACTS_ROOT, force: Force = False,
             model: Annotated[Optional[str], typer.Option(help="Start from a pretrained GPT-2: hub id or local folder.")] = None,
             data: Annotated[Optional[str], typer.Option(help="Text file, folder of text files, or hf:DATASET.")] = None,
             resume: Annotated[bool, typer.Option(help="Continue an interrupted fine-tune.")] = False) -> None:
    """Fine-tune GPT-2 (AMP, activation checkpointing, gradient accumulation, torch.compile)."""
    from pipeline.finetune import finetune as run_finetune

    cfg, rundir = _setup(preset, config, sets, run, artifacts, model_source=model)
    if data is not None:
        cfg.data.source = data
    run_finetune(cfg, rundir, resume=resume, force=force)


@app.command()
@user_errors
def export(preset: Preset = "tiny", config: ConfigFile = None, sets: Sets = None, run: RunName = None,
           artifacts: Artifacts = ARTIFACTS_ROOT, force: Force = False,
           precision: Annotated[Optional[list[str]], typer.Option(help="Only these precisions (repeatable): fp32, fp16, int8, int8-wo.")] = None) -> None:
    """Export the checkpoint to ONNX with a KV cache in fp32, fp16, int8 (Q/DQ) and int8 weight-only."""
    from pipeline.export.stage import export as run_export

    cfg, rundir = _setup(preset, config, sets, run, artifacts)
    if precision:
        cfg.export.precisions = precision
        validate_config(cfg)
    run_export(cfg, rundir, force=force)


@app.command()
@user_errors
def profile(preset: Preset = "tiny", config: ConfigFile = None, sets: Sets = None, run: RunName = None,
            artifacts: Artifacts = ARTIFACTS_ROOT,
            steps: Annotated[int, typer.Option(min=1, help="Training steps to record.")] = 3) -> None:
    """Profile a few training steps: a Chrome trace and a top-ops table in reports/profile/."""
    from pipeline.profiling import profile_training

    cfg, rundir = _setup(preset, config, sets, run, artifacts)
    profile_training(cfg, rundir, steps=steps)


@app.command("train-bench")
@user_errors
def train_bench(preset: Preset = "gpt2", config: ConfigFile = None, sets: Sets = None, run: RunName = None,
                artifacts: Artifacts = ARTIFACTS_ROOT,
                settings: Annotated[str, typer.Option(help="Comma-separated settings to compare.")] =
                "fp32,amp-bf16,amp-bf16+ckpt,amp-bf16+compile,amp-bf16+ckpt+compile",
                steps: Annotated[int, typer.Option(min=1, help="Timed steps per setting.")] = 10) -> None:
    """Benchmark training throughput, memory and MFU per setting on the GPU."""
    from pipeline.train_bench import train_bench as run_bench

    cfg, rundir = _setup(preset, config, sets, run, artifacts)
    result = run_bench(cfg, [s for s in settings.split(",") if s], steps=steps)
    atomic_write_json(rundir.reports / "train_bench.json", result)
    table = Table(title=f"training step, {result['gpu']}, batch {result['batch_size']} x {result['block_size']} tokens")
    for col in ("setting", "tokens/s", "step ms", "peak GiB", "MFU (datasheet)", "MFU (measured matmul)", "warm-up s"):
        table.add_column(col, justify="left" if col == "setting" else "right")
    for r in result["rows"]:
        if "error" in r:
            table.add_row(r["setting"], r["error"], *[""] * 5)
            continue
        pct = lambda v: f"{100 * v:.1f}%" if v is not None else "n/a"  # noqa: E731
        table.add_row(r["setting"], f"{r['tokens_per_s']:,.0f}", f"{r['step_ms']:.1f}", f"{r['peak_memory_gib']:.2f}",
                      pct(r["mfu_datasheet"]), pct(r["mfu_measured_matmul"]), f"{r['warmup_s']:.1f}")
    console.print(table)


@app.command()
def doctor(as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False) -> None:
    """Report what is installed and usable: torch/CUDA/GPU, ONNX Runtime, TensorRT flavours, ModelOpt."""
    from pipeline.doctor import run_checks

    findings = run_checks()
    if as_json:
        print(json.dumps([f.__dict__ for f in findings], indent=2))
        return
    table = Table(title="gpt2-deploy doctor")
    for col in ("component", "status", "detail"):
        table.add_column(col)
    colour = {"ok": "green", "missing": "yellow", "unusable": "red"}
    for f in findings:
        table.add_row(f.component, f"[{colour[f.status]}]{f.status}[/]", f.detail)
    console.print(table)


if __name__ == "__main__":
    sys.exit(app())

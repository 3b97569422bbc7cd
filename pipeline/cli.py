"""The `gpt2-deploy` command: one subcommand per stage, each a thin layer over a plain function."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from pipeline.artifacts import ARTIFACTS_ROOT, RunDir
from pipeline.cli_errors import DEBUG, user_errors
from pipeline.config import PRESETS, Config, load_config, validate_config
from pipeline.contract import TARGETS
from pipeline.cores import hold_torch_to_usable_cores
from pipeline.errors import UserError
from pipeline.precisions import PRECISIONS

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="GPT-2 from PyTorch to validated, benchmarked ONNX Runtime and TensorRT engines.")

Preset = Annotated[str, typer.Option(help=f"Model shape and settings: {', '.join(PRESETS)}.")]
ConfigFile = Annotated[Optional[Path], typer.Option("--config", help="TOML file overriding the preset.")]
Sets = Annotated[Optional[list[str]], typer.Option("--set", help="Override one key, e.g. --set train.lr=3e-4 (repeatable).")]
# --run-name: under torchrun, whose parser takes --run for a prefix of its own --run-path and stops
RunName = Annotated[Optional[str], typer.Option("--run", "--run-name", help="Run folder name under --artifacts "
                                                "(default: the preset; --run-name under torchrun).")]
Artifacts = Annotated[Path, typer.Option("--artifacts", help="Folder that holds the run folders.")]
Force = Annotated[bool, typer.Option("--force", metavar="", help="Redo the stage even if its outputs are up to date.")]
Device = Annotated[str, typer.Option(help="auto (cuda if visible), cpu, cuda or cuda:N.")]
Port = Annotated[int, typer.Option(min=1, max=65535)]
# the backend names, as loader.BACKENDS has them: written out so that --help needs no torch import
BACKEND_NAMES = "torch, torch-compiled, triton, ort, ort-fused, ort-genai, trt"
BackendName = Annotated[str, typer.Option("--backend", help=f"One of {BACKEND_NAMES}.")]
BackendFilter = Annotated[Optional[list[str]], typer.Option("--backend", help=f"Only these backends (repeatable): {BACKEND_NAMES}.")]
PrecisionFilter = Annotated[Optional[list[str]], typer.Option(
    "--precision", help=f"Only these precisions (repeatable): {', '.join(PRECISIONS)}.")]
PrecisionName = Annotated[str, typer.Option("--precision", help=f"One of {', '.join(PRECISIONS)}.")]


@app.callback()
def main(debug: Annotated[bool, typer.Option("--debug", metavar="", help="Show tracebacks for errors.")] = False) -> None:
    DEBUG["on"] = debug
    hold_torch_to_usable_cores()


def _setup(preset: str, config: Optional[Path], sets: Optional[list[str]], run: Optional[str], artifacts: Path,
           **top_level) -> tuple[Config, RunDir]:
    cfg = load_config(preset, config, sets, run=run, **top_level)
    return cfg, RunDir(artifacts / cfg.run_name)


def _relaunch_on_ranks(nproc: int) -> None:
    """With --nproc N above 1 outside torchrun: this command again, once per rank, under torchrun's
    launcher; exits with the ranks' exit code."""
    if nproc > 1 and "WORLD_SIZE" not in os.environ:
        from pipeline.train.distributed import launch

        argv = [a for i, a in enumerate(sys.argv[1:]) if not (a.startswith("--nproc") or sys.argv[i] == "--nproc")]
        raise typer.Exit(launch(nproc, argv))


@app.command()
@user_errors
def finetune(preset: Preset = "tiny", config: ConfigFile = None, sets: Sets = None, run: RunName = None,
             artifacts: Artifacts = ARTIFACTS_ROOT, force: Force = False,
             model: Annotated[Optional[str], typer.Option(help="Start from a pretrained GPT-2: hub id or local folder.")] = None,
             data: Annotated[Optional[str], typer.Option(help="Text file, folder of text files, or hf:DATASET.")] = None,
             resume: Annotated[bool, typer.Option(metavar="", help="Continue an interrupted fine-tune.")] = False,
             nproc: Annotated[int, typer.Option(min=1, help="Processes (one per GPU), started through torchrun with "
                                                "DistributedDataParallel; train.batch_size is per process.")] = 1) -> None:
    """Fine-tune GPT-2 (AMP, activation checkpointing, gradient accumulation, torch.compile, DDP)."""
    from pipeline.train.finetune import finetune as run_finetune

    cfg, rundir = _setup(preset, config, sets, run, artifacts, model_source=model)
    with rundir.exclusive("finetune"):
        _relaunch_on_ranks(nproc)
        if data is not None:
            cfg.data.source = data
        run_finetune(cfg, rundir, resume=resume, force=force)


@app.command()
@user_errors
def export(preset: Preset = "tiny", config: ConfigFile = None, sets: Sets = None, run: RunName = None,
           artifacts: Artifacts = ARTIFACTS_ROOT, force: Force = False,
           precision: PrecisionFilter = None,
           target: Annotated[Optional[list[str]], typer.Option(
               help=f"Only these graph families (repeatable): {', '.join(TARGETS)} (portable: standard ONNX, "
                    "what TensorRT builds from; ort: ONNX Runtime's fused operators and an onnxruntime-genai folder).")] = None) -> None:
    """Export the checkpoint to ONNX with a KV cache in fp32, fp16, int8 and int8 weight-only: the portable
    graphs and ONNX Runtime's fused ones."""
    from pipeline.export.stage import export as run_export

    cfg, rundir = _setup(preset, config, sets, run, artifacts)
    _known("--precision", precision, PRECISIONS)
    _known("--target", target, TARGETS)
    if precision or target:
        cfg.export.precisions = precision or cfg.export.precisions
        cfg.export.targets = target or cfg.export.targets
        validate_config(cfg)
    with rundir.exclusive("export"):
        run_export(cfg, rundir, force=force)


@app.command("build-engine")
@user_errors
def build_engine(preset: Preset = "tiny", config: ConfigFile = None, sets: Sets = None, run: RunName = None,
                 artifacts: Artifacts = ARTIFACTS_ROOT, force: Force = False,
                 precision: PrecisionFilter = None,
                 flavour: Annotated[str, typer.Option(help="auto (tensorrt, then tensorrt_rtx), tensorrt or tensorrt_rtx.")] = "auto",
                 target: Annotated[Optional[str], typer.Option(help="TensorRT-RTX compute capabilities, e.g. sm86,sm89,sm120.")] = None,
                 log_level: Annotated[str, typer.Option(help="Builder log level: error, warning, info, verbose.")] = "warning") -> None:
    """Build TensorRT engines (tensorrt or tensorrt_rtx) from the exported ONNX graphs."""
    from pipeline.engines.builder import LOG_LEVELS
    from pipeline.engines.stage import build_engines

    if log_level not in LOG_LEVELS:
        raise UserError(f"--log-level {log_level!r}: choose one of {', '.join(LOG_LEVELS)}")
    cfg, rundir = _setup(preset, config, sets, run, artifacts)
    targets = [t.strip().lower() for t in target.split(",") if t.strip()] if target else None
    if targets:
        cfg.engine.targets = targets
        validate_config(cfg)
    with rundir.exclusive("build-engine"):
        build_engines(cfg, rundir, precision, flavour, targets, log_level, force)


def _device(spec: str):
    from pipeline.model import resolve_device
    return resolve_device(spec, "--device")


def _known(option: str, given: Optional[list[str]], known) -> None:
    """A UserError naming the flag for a value it does not take."""
    for name in given or []:
        if name not in known:
            raise UserError(f"{option} {name}: unknown; choose from {', '.join(known)}")


def _pairs(matrix: list[tuple[str, str]], backend: Optional[list[str]], precision: Optional[list[str]]):
    from pipeline.runtime.loader import BACKENDS

    _known("--backend", backend, BACKENDS)
    _known("--precision", precision, PRECISIONS)
    pairs = [(b, p) for b, p in matrix if (not backend or b in backend) and (not precision or p in precision)]
    if not pairs:
        raise UserError(f"--backend {' '.join(backend or [])} --precision {' '.join(precision or [])}: "
                        "no backend runs that combination")
    return pairs


@app.command("validate")
@user_errors
def validate_cmd(preset: Preset = "tiny", config: ConfigFile = None, sets: Sets = None, run: RunName = None,
                 artifacts: Artifacts = ARTIFACTS_ROOT, device: Device = "auto",
                 backend: BackendFilter = None, precision: PrecisionFilter = None,
                 polygraphy: Annotated[bool, typer.Option(metavar="",
                                                          help="Also compare the ONNX graphs with Polygraphy.")] = False) -> None:
    """Compare every backend and precision with PyTorch fp32; exit 1 when one exceeds its budget."""
    from pipeline.runtime.loader import default_matrix
    from pipeline.validate import report, validate

    cfg, rundir = _setup(preset, config, sets, run, artifacts)
    report(validate(cfg, rundir, _device(device), _pairs(default_matrix(), backend, precision), polygraphy), rundir)


@app.command("bench")
@user_errors
def bench_cmd(preset: Preset = "tiny", config: ConfigFile = None, sets: Sets = None, run: RunName = None,
              artifacts: Artifacts = ARTIFACTS_ROOT, device: Device = "auto",
              backend: BackendFilter = None, precision: PrecisionFilter = None,
              batch: Annotated[str, typer.Option(help="Comma-separated batch sizes.")] = "1,8,64",
              prompt_tokens: Annotated[int, typer.Option(min=1, help="Prompt length.")] = 128,
              new_tokens: Annotated[int, typer.Option(min=1, help="Tokens generated per sequence.")] = 128,
              repeats: Annotated[int, typer.Option(min=1, help="Timed repeats (medians are reported).")] = 3,
              compare: Annotated[Optional[Path], typer.Option(help="An earlier bench.json: print the change.")] = None,
              sample: Annotated[bool, typer.Option(metavar="", help="A sampled row beside each greedy one.")] = False,
              temperature: Annotated[float, typer.Option(help="The sampled rows' temperature.")] = 0.8,
              top_p: Annotated[float, typer.Option(help="The sampled rows' nucleus mass in (0, 1].")] = 0.95,
              top_k: Annotated[int, typer.Option(help="The sampled rows' top-k (0 = off).")] = 0,
              deterministic: Annotated[bool, typer.Option("--deterministic", metavar="", help="Every row computed as "
                                                          "it would be alone (what serve --deterministic costs).")] = False) -> None:
    """Benchmark latency and throughput of every backend x precision x batch through the runtime."""
    from pipeline.bench import BenchSettings, bench
    from pipeline.bench_report import print_comparison, read_bench
    from pipeline.runtime.loader import bench_matrix
    from pipeline.runtime.sampling import Sampling

    cfg, rundir = _setup(preset, config, sets, run, artifacts)
    try:
        batches = sorted({int(b) for b in batch.split(",") if b.strip()})
    except ValueError:
        raise UserError(f"--batch {batch!r}: give comma-separated whole numbers, e.g. 1,8,64") from None
    if not batches or batches[0] < 1:
        raise UserError(f"--batch {batch!r}: batch sizes must be at least 1")
    old = read_bench(compare) if compare is not None else None
    sampled = None
    if sample:
        sampled = Sampling(max_new_tokens=new_tokens, do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k,
                           seed=0)
        sampled.check()
    settings = BenchSettings(batches, prompt_tokens, new_tokens, repeats, _pairs(bench_matrix(), backend, precision),
                             sampled, deterministic)
    result = bench(cfg, rundir, _device(device), settings)
    if old is not None:
        print_comparison(result, old)


@app.command()
@user_errors
def generate(prompt: Annotated[list[str], typer.Argument(help="One or more prompts (batched together).")],
             preset: Preset = "tiny", config: ConfigFile = None, sets: Sets = None, run: RunName = None,
             artifacts: Artifacts = ARTIFACTS_ROOT, device: Device = "auto",
             backend: BackendName = "ort", precision: PrecisionName = "fp32",
             max_new_tokens: Annotated[int, typer.Option(help="Tokens to generate.")] = 32,
             temperature: Annotated[float, typer.Option(help="Sampling temperature (with --sample).")] = 1.0,
             top_k: Annotated[int, typer.Option(help="Keep the k most likely tokens (0 = off).")] = 0,
             top_p: Annotated[float, typer.Option(help="Nucleus sampling mass in (0, 1].")] = 1.0,
             repetition_penalty: Annotated[float, typer.Option(help="> 1 discourages repeats.")] = 1.0,
             sample: Annotated[bool, typer.Option(metavar="", help="Sample instead of greedy decoding.")] = False,
             seed: Annotated[Optional[int], typer.Option(help="Seed for reproducible sampling.")] = None,
             deterministic: Annotated[bool, typer.Option("--deterministic", metavar="", help="Each prompt's tokens as "
                                                         "it would get them alone, run to run.")] = False) -> None:
    """Generate text from prompts through any backend, streaming the first prompt's tokens."""
    from pipeline.runtime.sampling import Sampling
    from pipeline.runtime.session import make_row_local, open_session, print_generation

    cfg, rundir = _setup(preset, config, sets, run, artifacts)
    session = open_session(rundir, backend, precision, _device(device))
    if deterministic:
        make_row_local(session.backend, len(prompt))
    print_generation(session, prompt, Sampling(max_new_tokens=max_new_tokens, do_sample=sample, temperature=temperature,
                                               top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty, seed=seed,
                                               stop_tokens=(session.eos,)))


@app.command()
@user_errors
def serve(preset: Preset = "tiny", config: ConfigFile = None, sets: Sets = None, run: RunName = None,
          artifacts: Artifacts = ARTIFACTS_ROOT, device: Device = "auto",
          backend: Annotated[Optional[str], typer.Option(help=f"One of {BACKEND_NAMES}; default: the fastest the run has.")] = None,
          precision: Annotated[Optional[str], typer.Option(help=f"One of {', '.join(PRECISIONS)}; default: the fastest.")] = None,
          host: Annotated[Optional[str], typer.Option(help="Address to listen on (config serve.host, default 127.0.0.1).")] = None,
          port: Annotated[Optional[int], typer.Option(
              min=1, max=65535, help="Port to listen on (config serve.port, default 8000).")] = None,
          max_body: Annotated[Optional[int], typer.Option(
              min=1024, help="Largest request body in bytes, 413 above (config serve.max_body).")] = None,
          queue: Annotated[Optional[int], typer.Option(
              min=1, help="Requests that may wait to start, 429 above (config serve.queue, default 64).")] = None,
          max_rows: Annotated[Optional[int], typer.Option(
              min=1, help="Prompts decoded at once, continuous batching (config serve.max_rows, default 64).")] = None,
          continuous: Annotated[bool, typer.Option(metavar="", help="Batch requests continuously (torch-compiled, triton); "
                                                   "--no-continuous serves one request at a time.")] = True,
          timeout: Annotated[Optional[float], typer.Option(
              min=0.1, help="Seconds a request may run, 504 after (config serve.timeout_s, default 120).")] = None,
          http_processes: Annotated[Optional[int], typer.Option(
              min=0, help="HTTP processes relaying the one engine (config serve.http_processes; default 0: 8 with a GPU "
                          "(at most half the cores), 1 on a CPU).")] = None,
          deterministic: Annotated[bool, typer.Option("--deterministic", metavar="", help="Every request's tokens the same alone "
                                                      "and beside any others (seeded ones too), at some throughput.")] = False,
          docs: Annotated[bool, typer.Option("--docs", metavar="", help="Also serve /docs and /openapi.json.")] = False) -> None:
    """Serve generation over HTTP: OpenAI's /v1/completions, /generate, /batch_generate, /health, /ready, /metrics."""
    try:
        from serve.server import serve_run
    except ImportError as e:
        raise UserError(f"serving needs the [serve] extra ({e.name} is missing): pip install 'gpt2-deploy[serve]'") from None
    from pipeline.engine_process.messages import EngineSpec

    flags = {"host": host, "port": port, "max_body": max_body, "queue": queue, "max_rows": max_rows, "timeout_s": timeout,
             "http_processes": http_processes}
    sets = [*(sets or []), *(f"serve.{key}={value}" for key, value in flags.items() if value is not None)]
    cfg, rundir = _setup(preset, config, sets, run, artifacts)
    where = _device(device)
    if backend is None:
        from pipeline.runtime.loader import fastest_ready
        backend, precision = fastest_ready(rundir, where, precision)
    spec = EngineSpec(rundir.root.resolve(), backend, precision or ("fp16" if where.type == "cuda" else "fp32"),
                      str(where), cfg.serve.max_rows, continuous, deterministic)
    failed = serve_run(spec, rundir.checkpoint, cfg.serve, cfg.serve.model_name or cfg.run_name, docs)
    if failed:
        raise typer.Exit(failed)


@app.command()
@user_errors
def package(preset: Preset = "tiny", config: ConfigFile = None, sets: Sets = None, run: RunName = None,
            artifacts: Artifacts = ARTIFACTS_ROOT, force: Force = False,
            fmt: Annotated[str, typer.Option("--format", help="triton: a Triton Inference Server model repository.")] = "triton",
            backend: Annotated[str, typer.Option(help=f"What the generation model runs: {BACKEND_NAMES}.")] = "triton",
            precision: PrecisionName = "fp16",
            device: Annotated[str, typer.Option(help="Where the generation model runs: cuda or cpu.")] = "cuda",
            name: Annotated[str, typer.Option(help="The generation model's name; the raw graphs' start with it.")] = "gpt2",
            max_rows: Annotated[int, typer.Option(min=1, help="Prompts the generation model decodes at once.")] = 64,
            instances: Annotated[int, typer.Option(min=1, help="Model instances (each its own engine process) on the CPU "
                                                           "or on each GPU.")] = 1,
            gpus: Annotated[Optional[str], typer.Option(help="The GPUs the instances run on, e.g. 0,1 (default: every "
                                                        "GPU of the server).")] = None) -> None:
    """Package the run for an inference server: <run>/triton, a model repository Triton Inference Server loads."""
    from pipeline.tritonserver.repository import package_triton

    if fmt != "triton":
        raise UserError(f"--format {fmt}: the one format is triton")
    try:
        indices = None if gpus is None else [int(g) for g in gpus.split(",")]
    except ValueError:
        raise UserError(f"--gpus {gpus}: GPU indices separated by commas, e.g. 0,1") from None
    _, rundir = _setup(preset, config, sets, run, artifacts)
    with rundir.exclusive("package"):
        package_triton(rundir, backend, precision, device, name, max_rows, force, instances, indices)


@app.command("triton-server")
@user_errors
def triton_server(repository: Annotated[Path, typer.Argument(help="A repository from `package --format triton`.")],
                  http_port: Port = 8000, grpc_port: Port = 8001, metrics_port: Port = 8002) -> None:
    """Start Triton Inference Server (nvidia-pytriton's tritonserver) on a repository's generation model."""
    from pipeline.tritonserver.server import run_server

    run_server(repository, http_port, grpc_port, metrics_port)


@app.command()
@user_errors
def loadtest(url: Annotated[str, typer.Argument(help="The server, e.g. http://127.0.0.1:8000.")],
             concurrency: Annotated[str, typer.Option(help="Comma-separated numbers of streaming clients (a sweep).")] = "1,8,64",
             rate: Annotated[Optional[float], typer.Option(min=0.01, help="Poisson arrivals per second instead of clients.")] = None,
             prompt_tokens: Annotated[int, typer.Option(min=1, help="Prompt length in tokens (about).")] = 128,
             max_tokens: Annotated[int, typer.Option(min=1, help="Tokens generated per request.")] = 128,
             spread: Annotated[float, typer.Option(min=0.0, max=0.99, help="Lengths uniform in n(1 ± spread).")] = 0.0,
             lengths: Annotated[Optional[Path], typer.Option(help="File of 'prompt_tokens output_tokens' lines, a request each.")] = None,
             ignore_eos: Annotated[bool, typer.Option(metavar="", help="Every request generates max-tokens.")] = True,
             duration: Annotated[float, typer.Option(min=1.0, help="Seconds measured per load level.")] = 15.0,
             warmup: Annotated[float, typer.Option(min=0.0, help="Seconds of load before each measurement.")] = 2.0,
             workers: Annotated[int, typer.Option(min=0, help="Client processes (0: one per 16 clients, up to the cores).")] = 0,
             temperature: Annotated[float, typer.Option(min=0.0, max=2.0, help="Sampled requests' temperature (0: greedy).")] = 0.0,
             top_p: Annotated[float, typer.Option(min=0.01, max=1.0, help="Sampled requests' top_p.")] = 1.0,
             top_k: Annotated[int, typer.Option(min=-1, help="Sampled requests' top_k (-1: off).")] = -1,
             sampled_share: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of requests that sample (the rest greedy).")] = 1.0,
             triton_model: Annotated[Optional[str], typer.Option(help="A Triton server's model: its generate_stream.")] = None,
             out: Annotated[Path, typer.Option(help="Folder for loadtest.json, .md and .png.")] = ARTIFACTS_ROOT / "loadtest") -> None:
    """Measure a running server as clients see it: throughput, time to first token, inter-token latency."""
    from serve.load_report import write_reports
    from serve.loadtest import LoadSettings
    from serve.loadtest import loadtest as run_loadtest

    try:
        levels = [int(c) for c in concurrency.split(",") if c.strip()]
    except ValueError:
        raise UserError(f"--concurrency {concurrency!r}: give comma-separated whole numbers, e.g. 1,8,64") from None
    if not rate and (not levels or min(levels) < 1):
        raise UserError(f"--concurrency {concurrency!r}: give at least one number of clients, each at least 1")
    settings = LoadSettings(url.rstrip("/"), levels, rate, prompt_tokens, max_tokens, spread, ignore_eos, duration, warmup,
                            temperature=temperature, top_p=top_p, top_k=top_k, sampled_share=sampled_share, workers=workers,
                            triton_model=triton_model, lengths_file=str(lengths) if lengths else None)
    write_reports(run_loadtest(settings), out)


@app.command()
@user_errors
def profile(preset: Preset = "tiny", config: ConfigFile = None, sets: Sets = None, run: RunName = None,
            artifacts: Artifacts = ARTIFACTS_ROOT,
            steps: Annotated[int, typer.Option(min=1, help="Training steps to record.")] = 3) -> None:
    """Profile a few training steps: a Chrome trace and a top-ops table in reports/profile/."""
    from pipeline.train.profiling import profile_training

    cfg, rundir = _setup(preset, config, sets, run, artifacts)
    with rundir.exclusive("profile"):
        profile_training(cfg, rundir, steps=steps)


@app.command("train-bench")
@user_errors
def train_bench(preset: Preset = "gpt2", config: ConfigFile = None, sets: Sets = None, run: RunName = None,
                artifacts: Artifacts = ARTIFACTS_ROOT,
                settings: Annotated[str, typer.Option(help="Comma-separated settings to compare.")] =
                "fp32,amp-bf16,amp-bf16+ckpt,amp-bf16+compile,amp-bf16+ckpt+compile",
                steps: Annotated[int, typer.Option(min=1, help="Timed steps per setting.")] = 10,
                nproc: Annotated[int, typer.Option(min=1, help="Ranks (one per GPU) through torchrun, as finetune "
                                                   "runs them; the report adds rank 0 alone and the scaling efficiency.")] = 1) -> None:
    """Benchmark training throughput, memory and MFU per setting (on one device, or on --nproc ranks)."""
    from pipeline.train.bench import report
    from pipeline.train.bench import train_bench as run_bench
    from pipeline.train.distributed import ranks_from_env

    cfg, rundir = _setup(preset, config, sets, run, artifacts)
    _relaunch_on_ranks(nproc)
    ranks = ranks_from_env()
    result = run_bench(cfg, [s for s in settings.split(",") if s], steps=steps, ranks=ranks)
    if ranks.main:
        report(result, rundir)


@app.command()
def doctor(as_json: Annotated[bool, typer.Option("--json", metavar="", help="Machine-readable output.")] = False) -> None:
    """Report what is installed and usable: torch/CUDA/GPU, ONNX Runtime, TensorRT flavours, ModelOpt."""
    from pipeline.doctor import report, run_checks

    report(run_checks(), as_json)


if __name__ == "__main__":
    sys.exit(app())

"""The finetune stage: packed blocks in, a Hugging Face checkpoint and reports/finetune.json out.

Resumable: the training state (weights, optimizer, scheduler, scaler, RNG, step and data position)
is saved every `train.save_interval` steps and when SIGINT/SIGTERM arrives; `--resume` continues
exactly where it stopped, so a resumed run ends with the same weights as an uninterrupted one.
Under FSDP the weights and optimizer state are torch.distributed.checkpoint shards, one set per
rank, which a run at another rank count reads back resharded.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from pipeline.artifacts import (
    RunDir,
    atomic_dir,
    atomic_write_json,
    fingerprint,
    replace_dir,
)
from pipeline.config import Config
from pipeline.data import PackedBlocks, ResumableSampler, prepare_data
from pipeline.errors import Interrupted, UserError
from pipeline.machine import cpu_description, free_memory, gpt2_parameters, shape_description
from pipeline.model import load_gpt2, new_model, resolve_device, shape_of
from pipeline.progress import console, progress_task
from pipeline.tokenizer import embedded_gpt2_tokenizer
from pipeline.train.distributed import (
    Ranks,
    any_rank,
    barrier,
    process_group,
    rank_device,
    ranks_from_env,
)
from pipeline.train.stepper import Stepper, flops_per_token, peak_flops, peak_memory_bytes, training_state_error

STATE_FILE = "state.pt"
SHARDS = "shards"  # FSDP: torch.distributed.checkpoint's folder beside the state file
FINAL_EVAL_BATCHES = 200


def stage_fingerprint(cfg: Config, data_hashes: dict[str, str], world: int = 1) -> str:
    """What the checkpoint depends on. The batch is the global one (train.batch_size is per rank), so
    a run stopped at one rank count resumes at another with the same global batch."""
    train = {**cfg.section("train"), "batch_size": cfg.train.batch_size * world}
    return fingerprint(cfg.model_source, cfg.section("model"), train, cfg.data.block_size, data_hashes)


@contextlib.contextmanager
def _stop_requests():
    """Turn SIGINT/SIGTERM into a flag the loop checks between steps, so state is saved whole."""
    requested: list[int] = []
    handler = lambda signum, frame: requested.append(signum)  # noqa: E731
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield requested
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _rng_state() -> dict:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _ignore_stop_signals(worker_id: int) -> None:
    """In a DataLoader worker: a SIGTERM or Ctrl-C sent to the whole process group (as `timeout` and
    systemd send it) must not kill the worker before the main process has saved the training state;
    the main process ends its workers itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


@contextlib.contextmanager
def _loader(dataset: PackedBlocks, cfg: Config, device: torch.device, start: int, ranks: Ranks):
    """The training batches from `start` on; its worker processes end with the block, also when an
    exception leaves it: they ignore SIGTERM (_ignore_stop_signals), so the exit's terminate() could not
    end them, and the exit waited on them for ever."""
    t = cfg.train
    sampler = ResumableSampler(len(dataset), t.seed, start, ranks.rank, ranks.world, t.batch_size)
    # its own generator: worker seeding must not draw from the global RNG that dropout uses,
    # or a resumed run would diverge from an uninterrupted one
    loader = DataLoader(dataset, batch_size=t.batch_size, sampler=sampler,
                        num_workers=t.num_workers, pin_memory=device.type == "cuda",
                        persistent_workers=t.num_workers > 0, generator=torch.Generator().manual_seed(t.seed),
                        worker_init_fn=_ignore_stop_signals if t.num_workers > 0 else None)
    batches = iter(loader)
    try:
        yield batches
    finally:
        if t.num_workers > 0:
            batches._shutdown_workers()  # what the iterator's __del__ does; a traceback's frames keep it alive


def _eval_batches(dataset: PackedBlocks, batch_size: int, limit: int):
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False)
    return itertools.islice(loader, limit)


def finetune(cfg: Config, run: RunDir, resume: bool = False, force: bool = False,
             on_step: Callable[[int], None] | None = None) -> dict:
    """Run (or resume) fine-tuning; returns the report. `on_step(step)` is called after each step.
    Under torchrun every rank runs this (pipeline.train.distributed); rank 0 writes what lands."""
    ranks = ranks_from_env()
    device = rank_device(resolve_device(cfg.train.device), ranks)
    with process_group(ranks, device, cfg.train.sharded), contextlib.ExitStack() as cleanup:
        return _finetune(cfg, run, resume, force, on_step, ranks, device, cleanup)


def _refuse_a_state_that_cannot_fit(cfg: Config, device: torch.device, ranks: Ranks, loaded: bool) -> None:
    """A one-line error before a model is built whose training state the device cannot hold (gpt2-xl on
    a 24 GB CPU), where the system would kill the process at its first step. loaded: a model already
    read into host memory (--model), whose weights that memory already holds."""
    m = cfg.model
    free = free_memory(device)
    if free is not None and device.type == "cpu":  # ranks on one host share its memory; a GPU is a rank's own
        free //= ranks.local_world
    error = training_state_error(gpt2_parameters(m.n_layer, m.n_embd, m.vocab_size, m.n_positions), free,
                                 ranks.world if cfg.train.sharded else 1, resident=loaded and device.type == "cpu",
                                 device=device.type)
    if error:
        raise UserError(error)


def _finetune(cfg: Config, run: RunDir, resume: bool, force: bool, on_step: Callable[[int], None] | None,
              ranks: Ranks, device: torch.device, cleanup: contextlib.ExitStack) -> dict:
    tokenizer = embedded_gpt2_tokenizer()
    if ranks.main:  # the data is prepared once; the other ranks then read it
        run.ensure_writable()
        prepare_data(cfg, run, tokenizer, force=force)
    barrier(ranks)
    splits = prepare_data(cfg, run, tokenizer)
    stage_fp = stage_fingerprint(cfg, run.artifact_hashes("data"), ranks.world)
    state_path = run.train_state / STATE_FILE
    if not force and not resume and run.is_fresh("finetune", stage_fp):
        console.print(f"finetune: {run.checkpoint} is up to date (nothing to do; --force retrains)")
        return _load_report(run)
    state = _load_state(state_path, stage_fp, cfg.train.steps) if resume else None
    if state is None and state_path.exists() and not force:
        raise UserError(f"{state_path}: an interrupted fine-tune is here; pass --resume to continue it or --force to start over")

    t = cfg.train
    if cfg.model_source:
        model = load_gpt2(cfg.model_source)
        cfg.model = shape_of(model.config)
    _refuse_a_state_that_cannot_fit(cfg, device, ranks, loaded=bool(cfg.model_source))
    if not cfg.model_source:
        model = new_model(cfg.model, t.seed)
    if cfg.data.block_size > model.config.n_positions:
        raise UserError(f"data.block_size {cfg.data.block_size} exceeds the model's n_positions {model.config.n_positions}")
    model.to(device)
    stepper = Stepper(model, t, device, ranks)
    step, samples, history, evals = 0, 0, [], []
    torch.manual_seed(t.seed)
    if state is not None:  # the fingerprint holds train.parallel: the state's layout is this stepper's
        stepper.load_state(state["stepper"], run.train_state / SHARDS)
        step, samples, history, evals = state["step"], state["samples"], state["history"], state["evals"]
        _set_rng_state(state["rng"])
        if ranks.main:
            console.print(f"finetune: resuming at step {step}/{t.steps}")

    train_set = PackedBlocks(splits.train, cfg.data.block_size)
    heldout_set = PackedBlocks(splits.heldout, cfg.data.block_size)
    batches = cleanup.enter_context(_loader(train_set, cfg, device, samples, ranks))
    samples_per_step = t.batch_size * t.grad_accum * ranks.world  # all ranks: the global batch
    tokens_per_step = samples_per_step * cfg.data.block_size
    n_params = sum(p.numel() for p in model.parameters())
    peak, device_name = peak_flops(device)
    if step == 0:
        evals.append({"step": 0, "heldout_loss": stepper.evaluate(_eval_batches(heldout_set, t.batch_size, t.eval_batches))})

    def save_state() -> None:
        """The state file, written by rank 0 (with the whole weights, or beside every rank's shards),
        into a folder that replaces the last saved state only once all of it is written."""
        # never overwrite a good state with a diverged one; every rank looks at its own shard
        if any_rank(not all(bool(p.isfinite().all()) for p in model.parameters()), ranks, device):
            raise UserError(f"finetune: the weights are no longer finite at step {step} (the run diverged; lower "
                            f"train.lr); {_kept(run)}")
        saving = _saving_folder(run)
        if ranks.main:
            shutil.rmtree(saving, ignore_errors=True)  # what a killed save left
            saving.mkdir(parents=True)
        barrier(ranks)
        try:
            if stepper.sharded:
                stepper.save_shards(saving / SHARDS)
            if ranks.main:
                torch.save({"fingerprint": stage_fp, "stepper": stepper.state(), "step": step, "samples": samples,
                            "history": history, "evals": evals, "rng": _rng_state(), "world": ranks.world,
                            "sharded": stepper.sharded}, saving / STATE_FILE)
                replace_dir(saving, run.train_state)
        except BaseException:  # a full disk: the part written goes, so that it does not hold the space
            shutil.rmtree(saving, ignore_errors=True)
            raise
        barrier(ranks)

    timed_tokens, timed_seconds = 0, 0.0
    with _stop_requests() as stop, progress_task("finetune", t.steps, visible=ranks.main) as bar:
        bar.advance(step)
        while step < t.steps:
            if any_rank(bool(stop), ranks, device):  # a signal to one rank stops every rank at this step
                save_state()
                raise Interrupted(f"finetune: stopped at step {step}/{t.steps}; state saved in {run.train_state}, "
                                  "continue with --resume", stop[0] if stop else signal.SIGTERM)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            loss = stepper.step(batches)
            elapsed = time.perf_counter() - started
            if not math.isfinite(loss):
                raise UserError(f"finetune: the loss is {loss} at step {step + 1} (the run diverged; lower train.lr or "
                                f"use train.precision=bf16); {_kept(run)}")
            step, samples = step + 1, samples + samples_per_step
            if step > 1:  # the first step pays for compilation and allocator warm-up
                timed_tokens, timed_seconds = timed_tokens + tokens_per_step, timed_seconds + elapsed
            tok_s = tokens_per_step / elapsed
            if step % t.log_interval == 0 or step == t.steps:
                history.append({"step": step, "loss": round(loss, 5), "lr": stepper.scheduler.get_last_lr()[0],
                                "tokens_per_s": round(tok_s, 1)})
            if step % t.eval_interval == 0 and step < t.steps:
                evals.append({"step": step, "heldout_loss": stepper.evaluate(_eval_batches(heldout_set, t.batch_size, t.eval_batches))})
            if step % t.save_interval == 0 and step < t.steps:
                save_state()
            bar.advance(1, status=f"loss {loss:.3f}  {tok_s:,.0f} tok/s")
            if on_step is not None:
                on_step(step)

    final_loss = stepper.evaluate(_eval_batches(heldout_set, t.batch_size, FINAL_EVAL_BATCHES))
    evals.append({"step": step, "heldout_loss": final_loss, "final": True})
    tokens_per_s = timed_tokens / timed_seconds if timed_seconds else None
    m = cfg.model
    report = {
        "device": device_name, "model": shape_description(m.n_layer, m.n_head, m.n_embd, m.vocab_size, m.n_positions),
        "cpu": cpu_description(), "precision": str(stepper.dtype or torch.float32).replace("torch.", ""),
        "checkpointing": t.checkpointing, "compile": t.compile, "steps": step, "tokens_per_step": tokens_per_step,
        "parameters": n_params, "tokens_per_s": tokens_per_s, "ranks": ranks.world,
        "peak_memory_bytes": peak_memory_bytes(device),
        "peak_memory_kind": "cuda max_memory_allocated" if device.type == "cuda" else "process max RSS",
        "mfu": (tokens_per_s * flops_per_token(cfg.model, n_params, cfg.data.block_size) / (peak * ranks.world)
                if peak and tokens_per_s else None),
        "mfu_formula": "tokens/s * (6N + 12*L*C*T) / dense bf16 peak of the device (PaLM appendix B)",
        "heldout_loss_start": evals[0]["heldout_loss"], "heldout_loss_final": final_loss,
        "heldout_perplexity_final": float(torch.tensor(final_loss).exp()),
        # what the perplexity is measured on: validate's is on other blocks (the last ones, calibration's size)
        "heldout_perplexity_measured_on": f"held-out blocks of data.block_size={cfg.data.block_size} tokens, "
                                          f"up to {FINAL_EVAL_BATCHES} batches of them",
        "train_loss": history, "heldout_loss": evals,
    }
    weights = stepper.weights() if stepper.sharded else None  # every rank sends its shards
    if not ranks.main:
        return report
    if weights is not None:  # a plain model of the same shape to write them from
        model = new_model(cfg.model, t.seed)
        model.load_state_dict(weights)
    _write_checkpoint(model, tokenizer, run.checkpoint)
    atomic_write_json(run.reports / "finetune.json", report)
    run.record("finetune", [run.checkpoint, run.reports / "finetune.json"], stage_fp, cfg.to_dict())
    for folder in (run.train_state, _saving_folder(run)):
        shutil.rmtree(folder, ignore_errors=True)
    console.print(f"finetune: held-out loss {report['heldout_loss_start']:.3f} -> {final_loss:.3f} "
                  f"(perplexity {report['heldout_perplexity_final']:.1f} on the held-out {cfg.data.block_size}-token "
                  f"blocks); checkpoint in {run.checkpoint}")
    return report


def _write_checkpoint(model, tokenizer, folder: Path) -> None:
    with atomic_dir(folder) as tmp:
        model.save_pretrained(tmp)  # safetensors; the tied embedding / LM head is stored once
        tokenizer.save_pretrained(tmp)


def _saving_folder(run: RunDir) -> Path:
    """Where every rank writes the next state; one fixed name, since all ranks must find it."""
    return run.train_state.with_name(f".{run.train_state.name}.saving")


def _kept(run: RunDir) -> str:
    """What a diverged run leaves: the last periodic state, if one was saved, and no checkpoint."""
    state = run.train_state / STATE_FILE
    if state.exists():
        return f"the last good state is kept in {state} (--resume continues from it, --force starts over)"
    return "no state was saved before it and no checkpoint is written"


def _load_state(path: Path, stage_fp: str, steps: int) -> dict:
    if not path.exists():
        raise UserError(f"--resume: no interrupted fine-tune in {path.parent}; run without --resume")
    try:
        # tensors and plain data only: a state file that holds anything else is refused, never run
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or foreign file surfaces as many exception types
        raise UserError(f"{path}: unreadable training state ({type(e).__name__}); rerun with --force") from None
    if state.get("fingerprint") != stage_fp:
        raise UserError(f"{path}: saved with another config or corpus; rerun with the same settings, or --force to start over")
    for key in ("step", "samples"):  # what the loop counts from: a crafted or damaged state could skip it all
        value = state.get(key)
        if type(value) is not int or not 0 <= value <= (steps if key == "step" else 2**62):
            raise UserError(f"{path}: its {key} ({str(value)[:40]}) is not a count within train.steps={steps}; "
                            "rerun with --force to start over")
    if not all(isinstance(state.get(key), list) for key in ("history", "evals")):
        raise UserError(f"{path}: its loss history is missing or damaged; rerun with --force to start over")
    if state.get("sharded") and not (path.parent / SHARDS / ".metadata").is_file():
        raise UserError(f"{path.parent / SHARDS}: the sharded weights of this state are missing; rerun with --force")
    return state


def _load_report(run: RunDir) -> dict:
    return json.loads((run.reports / "finetune.json").read_text(encoding="utf-8"))

import json
import os
import signal

import pytest
import torch
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel

from pipeline.artifacts import RunDir
from pipeline.errors import Interrupted, UserError
from pipeline.train.finetune import finetune


def test_finetune_learns_and_writes_a_loadable_checkpoint(micro_config, tmp_path):
    cfg = micro_config("train.steps=30", "train.lr=3e-3", "train.eval_interval=10")
    run = RunDir(tmp_path / "run")
    report = finetune(cfg, run)
    assert report["heldout_loss_final"] < report["heldout_loss_start"] - 1.0
    model = GPT2LMHeadModel.from_pretrained(run.checkpoint)
    assert model.config.n_layer == 1 and (run.checkpoint / "tokenizer.json").exists()
    # tied embedding and LM head are stored once
    assert [k for k in load_file(run.checkpoint / "model.safetensors") if "wte" in k or "lm_head" in k] == ["transformer.wte.weight"]
    saved = json.loads((run.reports / "finetune.json").read_text())
    assert saved["tokens_per_s"] > 0 and saved["peak_memory_bytes"] > 0 and "6N" in saved["mfu_formula"]
    assert [e["step"] for e in saved["heldout_loss"]] == [0, 10, 20, 30]
    assert saved["model"] == {"preset": "custom", "parameters": model.num_parameters(), "layers": 1, "hidden": 32,
                              "heads": 2, "head_size": 16, "vocab": 50257, "context": 64}
    assert saved["cpu"]["logical_cores"] >= 1
    assert not run.train_state.exists()
    manifest = json.loads(run.manifest_path.read_text())
    assert "checkpoint/model.safetensors" in manifest["artifacts"] and "finetune" in manifest["stages"]


def test_unchanged_inputs_mean_nothing_to_do(micro_config, tmp_path):
    run = RunDir(tmp_path / "run")
    finetune(micro_config(), run)
    stamp = (run.checkpoint / "model.safetensors").stat().st_mtime_ns
    finetune(micro_config(), run)
    assert (run.checkpoint / "model.safetensors").stat().st_mtime_ns == stamp
    finetune(micro_config("train.lr=1e-3"), run)  # a changed config retrains
    assert (run.checkpoint / "model.safetensors").stat().st_mtime_ns != stamp


def test_resumed_run_matches_an_uninterrupted_one(micro_config, tmp_path):
    """SIGINT mid-run saves state; --resume ends with bit-identical weights (dropout on, so the
    RNG state is part of what must be restored)."""
    settings = ("model.dropout=0.1", "train.grad_accum=2", "train.save_interval=100")
    straight = RunDir(tmp_path / "straight")
    finetune(micro_config(*settings), straight)

    resumed = RunDir(tmp_path / "resumed")
    interrupt = lambda step: step == 3 and os.kill(os.getpid(), signal.SIGINT)  # noqa: E731
    with pytest.raises(Interrupted, match="stopped at step 3/8"):
        finetune(micro_config(*settings), resumed, on_step=interrupt)
    assert (resumed.train_state / "state.pt").exists() and not resumed.checkpoint.exists()
    with pytest.raises(UserError, match="pass --resume"):
        finetune(micro_config(*settings), resumed)
    finetune(micro_config(*settings), resumed, resume=True)

    a = load_file(straight.checkpoint / "model.safetensors")
    b = load_file(resumed.checkpoint / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    history = lambda run: json.loads((run.reports / "finetune.json").read_text())["train_loss"]  # noqa: E731
    assert [h["loss"] for h in history(straight)] == [h["loss"] for h in history(resumed)]


def test_resume_refuses_a_changed_config(micro_config, tmp_path):
    run = RunDir(tmp_path / "run")
    with pytest.raises(Interrupted):
        finetune(micro_config(), run, on_step=lambda step: step == 2 and os.kill(os.getpid(), signal.SIGTERM))
    with pytest.raises(UserError, match="saved with another config"):
        finetune(micro_config("train.lr=1e-2"), run, resume=True)
    with pytest.raises(UserError, match="no interrupted fine-tune"):
        finetune(micro_config(), RunDir(tmp_path / "other"), resume=True)


@pytest.mark.parametrize("step", [10**9, "abc", -1, 2.5])
def test_resume_refuses_a_state_whose_step_is_not_in_the_schedule(micro_config, tmp_path, step):
    """A crafted or damaged state (step past train.steps, not a count) is refused before anything trains or
    a checkpoint is written, in one line naming the file."""
    run = RunDir(tmp_path / "run")
    with pytest.raises(Interrupted):
        finetune(micro_config(), run, on_step=lambda s: s == 2 and os.kill(os.getpid(), signal.SIGTERM))
    path = run.train_state / "state.pt"
    state = torch.load(path, weights_only=True)
    torch.save({**state, "step": step}, path)
    with pytest.raises(UserError, match=r"state.pt: its step \(.*\) is not a count within train.steps=8; rerun with --force"):
        finetune(micro_config(), run, resume=True)
    assert not run.checkpoint.exists()


def test_mixed_precision_and_checkpointing_train_on_cpu(micro_config, tmp_path):
    report = finetune(micro_config("train.precision=bf16", "train.checkpointing=true", "train.grad_accum=2",
                                   "train.steps=4"), RunDir(tmp_path / "run"))
    assert report["precision"] == "bfloat16" and report["checkpointing"] is True
    assert report["heldout_loss_final"] < report["heldout_loss_start"]


def test_model_that_is_not_gpt2_is_refused(micro_config, tmp_path):
    folder = tmp_path / "bert"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert", "vocab_size": 30522}')
    cfg = micro_config()
    cfg.model_source = str(folder)
    with pytest.raises(UserError, match="a 'bert' model, but this pipeline takes GPT-2"):
        finetune(cfg, RunDir(tmp_path / "run"))


def test_start_from_a_pretrained_folder(micro_config, tmp_path):
    first = RunDir(tmp_path / "first")
    finetune(micro_config(), first)
    cfg = micro_config("train.steps=2")
    cfg.model_source = str(first.checkpoint)
    report = finetune(cfg, RunDir(tmp_path / "second"))
    assert report["heldout_loss_start"] == pytest.approx(
        json.loads((first.reports / "finetune.json").read_text())["heldout_loss_final"], rel=0.2)


def test_a_crafted_state_file_is_refused_and_never_runs(micro_config, tmp_path):
    """--resume loads tensors and plain data only: a pickle that would run code is refused by name."""
    run = RunDir(tmp_path / "run")
    with pytest.raises(Interrupted):
        finetune(micro_config(), run, on_step=lambda step: step == 2 and os.kill(os.getpid(), signal.SIGINT))
    marker = tmp_path / "payload-ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"fingerprint": "x", "payload": Payload()}, run.train_state / "state.pt")
    with pytest.raises(UserError, match=r"state.pt: unreadable training state \(UnpicklingError\)"):
        finetune(micro_config(), run, resume=True)
    assert not marker.exists()


def test_a_diverging_run_stops_and_writes_no_checkpoint(micro_config, tmp_path):
    """A learning rate that blows the weights up: the run stops at the first non-finite loss, with
    one line that says what to change, and leaves no checkpoint of NaN weights."""
    run = RunDir(tmp_path / "run")
    with pytest.raises(UserError, match=r"the loss is (nan|inf) at step \d+ \(the run diverged; lower train.lr"):
        finetune(micro_config("train.lr=1e30", "train.grad_clip=0", "train.warmup_steps=0"), run)
    assert not run.checkpoint.exists() and "finetune" not in json.loads(run.manifest_path.read_text())["stages"]


def test_sigterm_to_the_process_group_saves_the_state_and_exits_143(corpus_file, tmp_path):
    """What `timeout` and a default systemd stop do: SIGTERM to the main process and its DataLoader
    worker at once. The worker must outlive the main process's state save."""
    import subprocess
    import sys
    import time

    from tests.conftest import MICRO
    cmd = [sys.executable, "-m", "pipeline.cli", "finetune", "--artifacts", str(tmp_path), "--run", "run",
           *[a for s in MICRO for a in ("--set", s)], "--set", f"data.source={corpus_file}", "--set", "train.steps=100000",
           "--set", "train.num_workers=1", "--set", "train.save_interval=100000", "--set", "train.eval_interval=100000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    manifest, deadline = tmp_path / "run" / "manifest.json", time.monotonic() + 120
    while not (manifest.exists() and '"data"' in manifest.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(3)  # training steps, its worker started
    os.killpg(proc.pid, signal.SIGTERM)
    out = proc.communicate(timeout=120)[0].decode()
    assert proc.returncode == 143, out
    assert "state saved" in out and "Traceback" not in out
    state = torch.load(tmp_path / "run" / "train_state" / "state.pt", weights_only=True)
    assert state["step"] > 0


def test_a_failed_state_save_leaves_no_part_and_no_worker(micro_config, tmp_path, monkeypatch):
    """The disk fills during a state save: the part written is removed (it held the space), the error
    goes up, and the DataLoader's worker has ended (it ignores SIGTERM, so the exit waited on it)."""
    import errno
    import multiprocessing

    def full_disk(obj, path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(b"\0" * 4096)
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr("pipeline.train.finetune.torch.save", full_disk)
    run = RunDir(tmp_path / "run")
    with pytest.raises(OSError, match="No space left"):
        finetune(micro_config("train.num_workers=1", "train.save_interval=2"), run)
    assert not any(p.name.endswith(".saving") for p in run.root.iterdir()) and not run.train_state.exists()
    assert multiprocessing.active_children() == []


def test_an_unexpected_error_is_one_line_and_the_process_ends(corpus_file, tmp_path):
    """Any exception no check foresaw: one line naming it, exit 1, no traceback, and no process of the
    run left (its DataLoader worker once kept the exit waiting for ever)."""
    import subprocess
    import sys

    from tests.conftest import MICRO
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".train_state.saving").write_text("a file where the state's folder goes")
    cmd = [sys.executable, "-m", "pipeline.cli", "finetune", "--artifacts", str(tmp_path), "--run", "run",
           *[a for s in MICRO for a in ("--set", s)], "--set", f"data.source={corpus_file}",
           "--set", "train.num_workers=1", "--set", "train.save_interval=2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 1, out
    assert "error: finetune failed: FileExistsError" in out and "--debug finetune" in out and "Traceback" not in out
    with pytest.raises(ProcessLookupError):  # nothing of its process group is left
        os.killpg(proc.pid, 0)

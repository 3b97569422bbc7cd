"""Fine-tuning across processes: torchrun with the gloo backend on the CPU, against one process
with the same global batch."""

import itertools
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.data import ResumableSampler
from tests.conftest import MICRO


def test_ranks_split_each_micro_batch_of_the_one_stream():
    one = list(itertools.islice(iter(ResumableSampler(10, seed=3)), 24))
    ranks = [list(itertools.islice(iter(ResumableSampler(10, seed=3, rank=r, world=2, batch=3)), 12)) for r in (0, 1)]
    rebuilt = [i for step in range(4) for r in (0, 1) for i in ranks[r][3 * step:3 * step + 3]]
    assert rebuilt == one
    resumed = list(itertools.islice(iter(ResumableSampler(10, seed=3, start=12, rank=1, world=2, batch=3)), 6))
    assert resumed == one[15:18] + one[21:24]  # a start counts every rank's samples


def finetune_command(tmp_path, name: str, corpus) -> list[str]:
    return [sys.executable, "-m", "pipeline.cli", "finetune", "--artifacts", str(tmp_path), "--run", name,
            *[a for s in MICRO for a in ("--set", s)], "--set", f"data.source={corpus}", "--set", "train.steps=6",
            "--set", "train.grad_accum=2"]


def finetune(tmp_path, name: str, corpus, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([*finetune_command(tmp_path, name, corpus), *options], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_two_ranks_train_as_one_process_with_their_global_batch(corpus_file, tmp_path):
    """2 ranks x 2 blocks a micro-batch against 1 process x 4: the same samples per step, the
    gradients averaged across ranks once per step (no all-reduce on the accumulation steps), the
    same losses and weights within float tolerance; only rank 0 writes."""
    one = finetune(tmp_path, "one", corpus_file, "--set", "train.batch_size=4")
    two = finetune(tmp_path, "two", corpus_file, "--set", "train.batch_size=2", "--nproc", "2")
    assert one.returncode == 0, one.stdout + one.stderr
    assert two.returncode == 0, two.stdout + two.stderr
    report = {name: json.loads((tmp_path / name / "reports" / "finetune.json").read_text()) for name in ("one", "two")}
    assert report["two"]["ranks"] == 2 and report["two"]["tokens_per_step"] == report["one"]["tokens_per_step"]
    losses = {name: [h["loss"] for h in r["train_loss"]] for name, r in report.items()}
    assert losses["one"] == pytest.approx(losses["two"], rel=1e-4) and len(losses["one"]) == 6
    assert report["one"]["heldout_loss_final"] == pytest.approx(report["two"]["heldout_loss_final"], rel=1e-4)
    a, b = (load_file(tmp_path / name / "checkpoint" / "model.safetensors") for name in ("one", "two"))
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    assert (two.stdout + two.stderr).count("finetune: held-out loss") == 1  # one report line: rank 0's


@pytest.mark.slow
def test_a_run_stopped_at_two_ranks_resumes_at_one_in_the_same_data_order(corpus_file, tmp_path):
    """SIGTERM to the whole group (launcher and ranks) stops every rank at the same step; rank 0
    saves the state once. One process with the same global batch resumes it and ends where a run
    that never stopped ends (the data order is the same; the numbers within float tolerance)."""
    import signal
    import time

    long = ("--set", "train.steps=40", "--set", "train.save_interval=1000", "--set", "train.eval_interval=1000")
    straight = finetune(tmp_path, "straight", corpus_file, "--set", "train.batch_size=4", *long)
    assert straight.returncode == 0, straight.stderr
    cmd = [*finetune_command(tmp_path, "stopped", corpus_file), "--set", "train.batch_size=2", "--nproc", "2", *long]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    manifest, deadline = tmp_path / "stopped" / "manifest.json", time.monotonic() + 120
    while not (manifest.exists() and '"data"' in manifest.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(4)  # a few steps
    os.killpg(proc.pid, signal.SIGTERM)
    out = proc.communicate(timeout=120)[0].decode()
    assert proc.returncode == 143, out
    state = torch.load(tmp_path / "stopped" / "train_state" / "state.pt", weights_only=True)
    assert state["world"] == 2 and 0 < state["step"] < 40, out
    resumed = finetune(tmp_path, "stopped", corpus_file, "--set", "train.batch_size=4", "--resume", *long)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    a, b = (load_file(tmp_path / name / "checkpoint" / "model.safetensors") for name in ("straight", "stopped"))
    assert all(torch.allclose(a[k], b[k], atol=1e-4) for k in a)


def rank_pids(launcher: int) -> dict[int, int]:
    """The launcher's rank processes: rank -> pid, read from their environment."""
    ranks = {}
    for child in subprocess.run(["pgrep", "-P", str(launcher)], capture_output=True, text=True).stdout.split():
        try:
            env = dict(v.split("=", 1) for v in open(f"/proc/{child}/environ").read().split("\0") if "=" in v)
        except OSError:
            continue
        if "RANK" in env:
            ranks[int(env["RANK"])] = int(child)
    return ranks


def wait_for_state_then_kill_rank_1(proc: subprocess.Popen, run) -> dict:
    """Once the run has saved its state, SIGKILL rank 1 (no chance to save more): the run must fail
    and leave that state whole, and no checkpoint. -> the state"""
    import signal
    import time

    state, deadline = run / "train_state" / "state.pt", time.monotonic() + 180
    while not state.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    ranks = rank_pids(proc.pid)
    assert set(ranks) == {0, 1}, ranks
    os.kill(ranks[1], signal.SIGKILL)
    out = proc.communicate(timeout=180)[0].decode()
    assert proc.returncode != 0 and not (run / "checkpoint").exists(), out
    return torch.load(state, weights_only=True)


@pytest.mark.slow
def test_a_rank_killed_mid_run_fails_the_run_and_it_resumes_from_the_last_save(corpus_file, tmp_path):
    """SIGKILL to one rank (no chance to save): the run fails, the state saved every 2 steps stays
    whole, and --resume at the same rank count ends where a run never stopped ends."""
    long = ("--set", "train.steps=30", "--set", "train.save_interval=2", "--set", "train.eval_interval=1000")
    straight = finetune(tmp_path, "straight", corpus_file, "--set", "train.batch_size=2", "--nproc", "2", *long)
    assert straight.returncode == 0, straight.stderr
    proc = subprocess.Popen([*finetune_command(tmp_path, "killed", corpus_file), "--set", "train.batch_size=2",
                             "--nproc", "2", *long], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    saved = wait_for_state_then_kill_rank_1(proc, tmp_path / "killed")
    assert saved["world"] == 2 and 0 < saved["step"] < 30
    resumed = finetune(tmp_path, "killed", corpus_file, "--set", "train.batch_size=2", "--nproc", "2", "--resume", *long)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    a, b = (load_file(tmp_path / name / "checkpoint" / "model.safetensors") for name in ("straight", "killed"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # same ranks, same batches, resumed from a whole state: bit-exact


@pytest.mark.slow
def test_fsdp_ranks_train_as_one_process_and_resume_at_another_rank_count(corpus_file, tmp_path):
    """train.parallel=fsdp (FSDP2: each block's weights and optimizer state sharded over 2 ranks):
    the losses and weights of one process with the global batch. A run stopped after its periodic
    save (every rank's shards written by torch.distributed.checkpoint) resumes on one FSDP rank with
    the same global batch and ends where an unstopped 2-rank run does."""
    fsdp = ("--set", "train.parallel=fsdp", "--nproc", "2", "--set", "train.batch_size=2")
    one = finetune(tmp_path, "one", corpus_file, "--set", "train.batch_size=4")
    sharded = finetune(tmp_path, "sharded", corpus_file, *fsdp)
    assert one.returncode == 0 and sharded.returncode == 0, sharded.stdout + sharded.stderr
    report = {n: json.loads((tmp_path / n / "reports" / "finetune.json").read_text()) for n in ("one", "sharded")}
    assert [h["loss"] for h in report["one"]["train_loss"]] == pytest.approx(
        [h["loss"] for h in report["sharded"]["train_loss"]], rel=1e-4)
    a, b = (load_file(tmp_path / n / "checkpoint" / "model.safetensors") for n in ("one", "sharded"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)

    # stopped after its save at step 2 (SIGKILL to a rank: nothing saved after), resumed on 1 rank
    saving = ("--set", "train.parallel=fsdp", "--set", "train.save_interval=2", "--set", "train.steps=30")
    straight = finetune(tmp_path, "straight", corpus_file, *fsdp, *saving)
    assert straight.returncode == 0, straight.stderr
    proc = subprocess.Popen([*finetune_command(tmp_path, "stopped", corpus_file), *fsdp, *saving],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    saved = wait_for_state_then_kill_rank_1(proc, tmp_path / "stopped")
    assert saved["sharded"] and saved["world"] == 2 and "model" not in saved["stepper"]
    assert (tmp_path / "stopped" / "train_state" / "shards" / ".metadata").is_file()
    resumed = finetune(tmp_path, "stopped", corpus_file, *saving, "--set", "train.batch_size=4", "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert json.loads((tmp_path / "stopped" / "reports" / "finetune.json").read_text())["ranks"] == 1
    a, b = (load_file(tmp_path / n / "checkpoint" / "model.safetensors") for n in ("straight", "stopped"))
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def test_torchruns_own_parser_passes_the_run_name_on(tmp_path):
    """`torchrun ... gpt2-deploy finetune --run x` ends in torchrun's parser ("ambiguous option: --run
    could match --run-path, --run_path"); --run-name is the same option and passes through to ours."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--nproc-per-node", "2", "gpt2-deploy", "finetune", "--run", "x"])
    args = parser.parse_args(["--nproc-per-node", "2", "gpt2-deploy", "finetune", "--run-name", "x"])
    assert args.training_script_args == ["finetune", "--run-name", "x"]
    result = CliRunner().invoke(app, ["export", "--run-name", "nosuch", "--artifacts", str(tmp_path)])
    assert result.exit_code == 1 and f"{tmp_path / 'nosuch' / 'checkpoint'}: no checkpoint here" in result.output

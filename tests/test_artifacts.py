import json

import pytest

from pipeline.artifacts import RunDir, atomic_dir, fingerprint


def test_atomic_dir_leaves_nothing_behind_on_failure(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as tmp:
            (tmp / "half.bin").write_bytes(b"x")
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_replaces_old_contents(tmp_path):
    target = tmp_path / "out"
    for content in (b"old", b"new"):
        with atomic_dir(target) as tmp:
            (tmp / "f").write_bytes(content)
    assert (target / "f").read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_manifest_freshness_detects_changes(tmp_path):
    run = RunDir(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.bin").write_bytes(b"12345")
    fp = fingerprint({"lr": 1})
    run.record("stage", [tmp_path / "a"], fp, {"lr": 1})
    manifest = json.loads(run.manifest_path.read_text())
    assert manifest["artifacts"]["a/x.bin"]["stage"] == "stage" and "versions" in manifest["stages"]["stage"]
    assert run.is_fresh("stage", fp)
    assert not run.is_fresh("stage", fingerprint({"lr": 2}))
    (tmp_path / "a" / "x.bin").write_bytes(b"12346")  # same size, other content
    assert not run.is_fresh("stage", fp)
    run.forget("stage")
    assert run.artifact_hashes("stage") == {}


def test_a_stage_start_removes_what_a_killed_write_left(tmp_path):
    """kill -9 during an atomic write leaves its temporary file or folder; the next stage that
    writes to the run folder removes them, and nothing else."""
    run = RunDir(tmp_path / "run")
    (run.root / "onnx" / ".fp32.k2j3.tmp").mkdir(parents=True)
    (run.root / "onnx" / ".fp32.k2j3.tmp" / "model.onnx").write_bytes(b"partial")
    (run.root / ".train_state.x81.tmp").mkdir()
    (run.root / ".manifest.json.abc.tmp").write_text("{")
    (run.root / ".checkpoint.old-4242").mkdir()
    kept = [run.root / "onnx" / "fp32" / "model.onnx", run.root / ".hidden", run.root / "notes.tmp"]
    for path in kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("mine")
    run.ensure_writable()
    left = sorted(p.relative_to(run.root).as_posix() for p in run.root.rglob("*"))
    assert left == [".hidden", "notes.tmp", "onnx", "onnx/fp32", "onnx/fp32/model.onnx"]



def test_a_second_writer_of_a_run_gets_one_line_naming_the_holder_until_it_ends(tmp_path):
    """Another process holds the run (a stage writing it): a stage here is refused, naming the holder's pid
    and stage; once that process is gone (killed: the lock goes with it) the run is free again."""
    import subprocess
    import sys

    from pipeline.errors import UserError

    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from pipeline.artifacts import RunDir\n"
                               f"with RunDir({str(tmp_path / 'run')!r}).exclusive('export'):\n"
                               "    print('held', flush=True)\n    time.sleep(60)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=rf"run: another gpt2-deploy stage is writing this run \(pid and stage: "
                                            rf"{holder.pid} export\); wait for it"):
            with RunDir(tmp_path / "run").exclusive("finetune"):
                pass
    finally:
        holder.kill()
        holder.wait()
    with RunDir(tmp_path / "run").exclusive("finetune"):
        (tmp_path / "run" / "checkpoint").mkdir()
    assert (tmp_path / "run" / ".lock").read_text() == f"{__import__('os').getpid()} finetune"


def test_a_stage_that_made_a_run_folder_and_wrote_nothing_leaves_none(tmp_path):
    with pytest.raises(RuntimeError):
        with RunDir(tmp_path / "new").exclusive("export"):
            raise RuntimeError("the export failed before writing")
    assert not (tmp_path / "new").exists()

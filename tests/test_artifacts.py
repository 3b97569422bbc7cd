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

"""The run folder: where each stage's outputs live, the manifest that vouches for them, and
atomic writes so that an interrupted stage never leaves a file a later stage would trust.

    artifacts/<run>/
      data/          tokenised corpus splits (train.bin, heldout.bin, data.json)
      checkpoint/    Hugging Face format: config.json, model.safetensors, tokenizer files
      train_state/   resumable optimizer/scheduler/RNG state of an unfinished fine-tune
      onnx/<precision>/model.onnx
      engines/       TensorRT plans and their metadata
      reports/       one JSON (and sometimes markdown/png) per stage
      manifest.json  every artifact's sha256 and producing stage; each stage's fingerprint

A stage is up to date when the manifest holds its fingerprint (a hash of its config and of its
inputs' sha256) and every artifact it produced is still on disk with the recorded hash.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.errors import UserError

ARTIFACTS_ROOT = Path("artifacts")
# set while a stage holds its run folder's lock: the processes it starts (its ranks) write on its behalf
RUN_LOCK_HELD = "GPT2DEPLOY_RUN_LOCK_HELD"
STALE_TEMP = re.compile(r"\..+\.(tmp|old-\d+)")  # what atomic_write_bytes and atomic_dir leave if killed
TRACKED_PACKAGES = ("torch", "transformers", "tokenizers", "numpy", "onnx", "onnxscript", "onnxruntime",
                    "onnxruntime-gpu", "nvidia-modelopt", "polygraphy", "tensorrt", "tensorrt-rtx", "triton")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def fingerprint(*parts: Any) -> str:
    """A stable hash of JSON-able parts (configs, input hashes)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def package_versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in TRACKED_PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary sibling, then rename: readers see the old file or the whole new one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise UserError(f"{path.parent}: cannot write here ({e.strerror}); fix its permissions or pick another --artifacts") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


@contextlib.contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """Yield an empty sibling folder to fill; it replaces `target` only if the block succeeds."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the result is an ordinary folder
    except OSError as e:
        raise UserError(f"{target.parent}: cannot write here ({e.strerror}); choose a writable --artifacts folder") from None
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, target)


def replace_dir(filled: Path, target: Path) -> None:
    """Put the folder `filled` where `target` is, by renames: a reader sees the old or the new one."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    os.replace(filled, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def graph_files(graph: Path) -> tuple[Path, Path]:
    """An ONNX graph and the file its weights go to past protobuf's 2 GB (`model.onnx.data`, which may not exist)."""
    return graph, graph.with_name(f"{graph.name}.data")


def export_stage(precision: str, target: str = "portable") -> str:
    """The manifest's stage name of one exported graph: export-<precision>, export-<target>-<precision>."""
    return f"export-{precision}" if target == "portable" else f"export-{target}-{precision}"


class RunDir:
    """Paths of one run and its manifest."""

    def __init__(self, root: Path):
        self.root = Path(root)

    data = property(lambda self: self.root / "data")
    checkpoint = property(lambda self: self.root / "checkpoint")
    train_state = property(lambda self: self.root / "train_state")
    engines = property(lambda self: self.root / "engines")
    reports = property(lambda self: self.root / "reports")
    manifest_path = property(lambda self: self.root / "manifest.json")

    def onnx(self, precision: str, target: str = "portable") -> Path:
        """The folder of one exported graph: onnx/<precision>, or onnx-<target>/<precision> for another target."""
        return self.root / ("onnx" if target == "portable" else f"onnx-{target}") / precision

    @contextlib.contextmanager
    def exclusive(self, stage: str) -> Iterator[None]:
        """One writing stage at a time in this run folder: an exclusive lock on <run>/.lock for the stage's
        life, or a one-line UserError naming the holder's pid. The lock goes with its process, even a killed
        one. A run folder this made and the stage left empty is removed."""
        if os.environ.get(RUN_LOCK_HELD) or int(os.environ.get("RANK", "0")) != 0:  # its parent or rank 0 holds it
            yield
            return
        made = not self.root.exists()
        self.ensure_writable(clean=False)
        handle = open(self.root / ".lock", "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise UserError(f"{self.root}: another gpt2-deploy stage is writing this run (pid and stage: {holder}); "
                            "wait for it to end or pick another --run") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()} {stage}")
        handle.flush()
        os.environ[RUN_LOCK_HELD] = "1"
        try:
            yield
        finally:
            del os.environ[RUN_LOCK_HELD]
            handle.close()  # and with it the lock
            if made and [p.name for p in self.root.iterdir()] == [".lock"]:
                shutil.rmtree(self.root, ignore_errors=True)

    def ensure_writable(self, clean: bool = True) -> None:
        """Make the run folder, and remove what an earlier stage killed mid-write left (remove_stale_temps)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"{self.root}: cannot create the run folder ({e.strerror})") from None
        if not os.access(self.root, os.W_OK):
            raise UserError(f"{self.root}: the run folder is not writable; fix its permissions or pick another --artifacts")
        if clean:
            self.remove_stale_temps()

    def remove_stale_temps(self) -> list[Path]:
        """The temporary files and folders of atomic writes that never finished (the process was killed
        with SIGKILL, or the machine stopped): removed, since nothing will ever rename them into place.
        One stage at a time writes to a run folder, so none of them is still being written."""
        stale = [p for p in self.root.rglob(".*") if STALE_TEMP.fullmatch(p.name)]
        for path in sorted(stale, key=lambda p: len(p.parts)):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        return stale

    # manifest -----------------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        if not self.manifest_path.exists():
            return {"artifacts": {}, "stages": {}}
        try:
            return json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise UserError(f"{self.manifest_path}: corrupt manifest; delete it and rerun the stages (--force)") from None

    def rel(self, path: Path) -> str:
        return Path(path).resolve().relative_to(self.root.resolve()).as_posix()

    def record(self, stage: str, outputs: list[Path], stage_fingerprint: str, config: dict[str, Any],
               extra: dict[str, Any] | None = None) -> None:
        """Hash `outputs` (files or folders) and record them as `stage`'s artifacts."""
        manifest = self.manifest()
        arts = {k: v for k, v in manifest["artifacts"].items() if v.get("stage") != stage}
        for out in outputs:
            for f in _files_under(Path(out)):
                arts[self.rel(f)] = {"sha256": sha256_file(f), "size": f.stat().st_size, "stage": stage}
        manifest["artifacts"] = dict(sorted(arts.items()))
        manifest["stages"][stage] = {"fingerprint": stage_fingerprint, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                     "config": config, "versions": package_versions(), **(extra or {})}
        atomic_write_json(self.manifest_path, manifest)

    def forget(self, stage: str) -> None:
        """Drop a stage's record (its outputs just replaced, before their new record): the hashes of the
        record are checked against the files, so a crash between the two cannot look fresh either."""
        manifest = self.manifest()
        if stage in manifest["stages"] or any(a.get("stage") == stage for a in manifest["artifacts"].values()):
            manifest["stages"].pop(stage, None)
            manifest["artifacts"] = {k: v for k, v in manifest["artifacts"].items() if v.get("stage") != stage}
            atomic_write_json(self.manifest_path, manifest)

    def artifact_hashes(self, stage: str) -> dict[str, str]:
        """{relative path: sha256} of what `stage` produced, as recorded."""
        return {k: v["sha256"] for k, v in self.manifest()["artifacts"].items() if v.get("stage") == stage}

    def require_exported(self, precision: str, target: str = "portable") -> str:
        """The sha256 of the target's <precision>/model.onnx, if it (and its model.onnx.data, if any) is
        the graph export wrote from the checkpoint that is here now; else a UserError naming the file
        and what to rerun. A missing graph is left to the caller to report."""
        path = self.onnx(precision, target) / "model.onnx"
        if not path.exists():
            return ""
        manifest, redo = self.manifest(), "; rerun `gpt2-deploy export --force`"
        entry = manifest["stages"].get(export_stage(precision, target))
        if entry is None:
            raise UserError(f"{path}: not recorded in {self.manifest_path} (an export that did not finish?){redo}")
        if entry.get("checkpoint") != self.artifact_hashes("finetune"):
            raise UserError(f"{path}: exported from another checkpoint than {self.checkpoint}{redo}")
        recorded = {}
        for file in graph_files(path):
            recorded[file] = manifest["artifacts"].get(file.relative_to(self.root).as_posix(), {}).get("sha256")
            if (recorded[file] or file.exists()) and recorded[file] != (sha256_file(file) if file.exists() else None):
                raise UserError(f"{file}: not the {precision} graph export wrote (its sha256 differs from "
                                f"{self.manifest_path}){redo}")
        return recorded[path]

    def is_fresh(self, stage: str, stage_fingerprint: str) -> bool:
        manifest = self.manifest()
        entry = manifest["stages"].get(stage)
        if not entry or entry.get("fingerprint") != stage_fingerprint:
            return False
        for rel, art in manifest["artifacts"].items():
            if art.get("stage") != stage:
                continue
            path = self.root / rel
            if not path.is_file() or path.stat().st_size != art["size"] or sha256_file(path) != art["sha256"]:
                return False
        return True

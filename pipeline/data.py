"""Corpus -> documents -> tokens -> packed blocks, with a held-out split and calibration sets.

The embedded corpus is English text that every Python installation carries: the docstrings of
the standard library (found by parsing, never importing, its source files) and the help topics
of `pydoc_data`. It is deterministic for a given Python version and needs no download.
"""

from __future__ import annotations

import ast
import functools
import itertools
import sysconfig
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from pipeline.artifacts import RunDir, atomic_dir, fingerprint
from pipeline.config import Config
from pipeline.errors import UserError
from pipeline.progress import progress

TOKEN_DTYPE = np.uint16  # GPT-2's 50257 ids fit; half the disk and page cache of int32
TEXT_SUFFIXES = {".txt", ".md", ".rst", ".text"}


# --- corpus -------------------------------------------------------------------------------------

def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@functools.cache
def embedded_corpus() -> list[str]:
    """Docstrings of every stdlib module, class and function, then pydoc's help topics."""
    root = _stdlib_root()
    docs: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.relative_to(root).parts:
            continue
        try:
            with warnings.catch_warnings():  # old escape sequences in stdlib sources warn on parse
                warnings.simplefilter("ignore")
                tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # a few test files are deliberately invalid
        nodes = (n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)))
        docs.extend(d for d in (ast.get_docstring(n) for n in nodes) if d and len(d) > 40)
    topics = root / "pydoc_data" / "topics.py"
    if topics.exists():
        value = ast.parse(topics.read_text(encoding="utf-8")).body[-1].value
        docs.extend(text for _, text in sorted(ast.literal_eval(value).items()))
    return docs


def _user_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)


def read_corpus(source: str) -> list[str]:
    """Documents from the embedded corpus, a text file, a folder of text files, or `hf:NAME`."""
    if not source:
        return embedded_corpus()
    if source.startswith("hf:"):
        return _hub_dataset(source[3:])
    path = Path(source)
    if not path.exists():
        raise UserError(f"--data {source}: no such file or folder (or prefix a datasets name with hf:)")
    files = _user_files(path)
    if not files:
        raise UserError(f"--data {source}: no text files ({', '.join(sorted(TEXT_SUFFIXES))}) in this folder")
    docs = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise UserError(f"--data {f}: not UTF-8 text") from None
        # blank-line separated paragraphs are documents, so one big file still splits train/held-out
        docs.extend(p.strip() for p in text.split("\n\n") if p.strip())
    return docs


def _hub_dataset(name: str) -> list[str]:
    try:
        import datasets
    except ImportError:
        raise UserError(f"--data hf:{name}: the `datasets` package is not installed (pip install datasets)") from None
    try:
        ds = datasets.load_dataset(name, split="train")
    except Exception as e:  # network, auth, unknown name: all surface as different exception types
        raise UserError(f"--data hf:{name}: cannot load ({str(e).splitlines()[0]})") from None
    if "text" not in ds.column_names:
        raise UserError(f"--data hf:{name}: needs a 'text' column, has {ds.column_names}")
    return [t for t in ds["text"] if t and t.strip()]


def corpus_identity(source: str) -> dict:
    """What the tokenised splits depend on, cheap to compute (no reading of the text)."""
    if not source:
        import platform
        return {"embedded": "stdlib-docstrings", "python": platform.python_version()}
    if source.startswith("hf:"):
        return {"hub": source}
    path = Path(source)
    files = _user_files(path) if path.exists() else []
    return {"files": [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]}


# --- tokenised splits ---------------------------------------------------------------------------

@dataclass
class Splits:
    train: Path
    heldout: Path

    def tokens(self, split: str) -> np.ndarray:
        return np.memmap(getattr(self, split), dtype=TOKEN_DTYPE, mode="r")


def prepare_data(cfg: Config, run: RunDir, tokenizer, force: bool = False) -> Splits:
    """Tokenise the corpus once per run into train.bin and heldout.bin (EOS between documents)."""
    d = cfg.data
    stage_fp = fingerprint(corpus_identity(d.source), d.heldout_every, len(tokenizer))
    splits = Splits(run.data / "train.bin", run.data / "heldout.bin")
    if not force and run.is_fresh("data", stage_fp):
        _check_enough(cfg, splits)
        return splits
    docs = read_corpus(d.source)
    if not docs or not any(doc.strip() for doc in docs):
        raise UserError(f"--data {d.source or '(embedded)'}: the corpus is empty")
    parts: dict[str, list[np.ndarray]] = {"train": [], "heldout": []}
    eos = np.array([tokenizer.eos_token_id], dtype=TOKEN_DTYPE)
    for i, ids in enumerate(progress(_batched_encode(tokenizer, docs), total=len(docs), description="tokenise corpus")):
        parts["heldout" if i % d.heldout_every == d.heldout_every - 1 else "train"] += [np.asarray(ids, TOKEN_DTYPE), eos]
    with atomic_dir(run.data) as tmp:
        for split, arrays in parts.items():
            (np.concatenate(arrays) if arrays else np.zeros(0, TOKEN_DTYPE)).tofile(tmp / f"{split}.bin")
    run.record("data", [splits.train, splits.heldout], stage_fp, cfg.section("data"),
               {"documents": len(docs), "tokens": {s: int(sum(a.size for a in v)) for s, v in parts.items()}})
    _check_enough(cfg, splits)
    return splits


def _batched_encode(tokenizer, docs: list[str], batch: int = 256):
    for start in range(0, len(docs), batch):
        yield from tokenizer(docs[start:start + batch], add_special_tokens=False)["input_ids"]


def _check_enough(cfg: Config, splits: Splits) -> None:
    need = cfg.data.block_size + 1
    for split in ("train", "heldout"):
        n = splits.tokens(split).size
        if n < need:
            raise UserError(f"--data {cfg.data.source or '(embedded)'}: the {split} split has {n} tokens, fewer than one "
                            f"block of {need}; give more text or lower data.block_size")


# --- training blocks ----------------------------------------------------------------------------

class PackedBlocks(Dataset):
    """Non-overlapping windows of block_size + 1 tokens: inputs are the first block_size,
    targets the last block_size, so no token is padding and none is wasted."""

    def __init__(self, path: Path, block_size: int, limit: int | None = None):
        self.path, self.block_size = path, block_size
        n = (np.memmap(path, dtype=TOKEN_DTYPE, mode="r").size - 1) // block_size
        self.n = min(n, limit) if limit else n
        self._tokens = None  # opened lazily, once per DataLoader worker

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=TOKEN_DTYPE, mode="r")
        start = i * self.block_size
        window = torch.from_numpy(self._tokens[start:start + self.block_size + 1].astype(np.int64))
        return window[:-1], window[1:]


class ResumableSampler(Sampler[int]):
    """An endless stream of shuffled block indices, a fresh permutation per epoch, that can
    start at any position: resuming at sample k yields exactly what an uninterrupted run would.

    Across `world` ranks the stream is the same one, cut into micro-batches of `batch` x `world`
    samples of which rank r takes the r-th `batch`: the ranks together see what one process with
    batch x world samples a micro-batch sees, and `start` counts samples of all ranks, so a run
    resumes at another rank count in the same data order."""

    def __init__(self, n: int, seed: int, start: int = 0, rank: int = 0, world: int = 1, batch: int = 1):
        self.n, self.seed, self.start = n, seed, start
        self.rank, self.world, self.batch = rank, world, batch

    def stream(self):
        epoch, offset = divmod(self.start, self.n)
        while True:
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()
            yield from order[offset:]
            epoch, offset = epoch + 1, 0

    def __iter__(self):
        if self.world == 1:
            yield from self.stream()
            return
        stream, mine = self.stream(), slice(self.rank * self.batch, (self.rank + 1) * self.batch)
        while True:
            yield from list(itertools.islice(stream, self.batch * self.world))[mine]


def heldout_blocks(splits: Splits, count: int, block_size: int, option: str, from_end: bool = False) -> np.ndarray:
    """[count, block_size] int64 held-out token blocks. Export calibrates on blocks from the start
    of the split; validate measures on blocks from its end, so the two never share text."""
    tokens = splits.tokens("heldout")
    available = tokens.size // block_size
    if available < count:
        raise UserError(f"{option}={count}: the held-out split holds only {available} blocks of {block_size} "
                        f"tokens; lower {option}, or add text")
    start = (available - count) * block_size if from_end else 0
    return np.asarray(tokens[start:start + count * block_size], dtype=np.int64).reshape(count, block_size)

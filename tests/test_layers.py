"""The package's import layers: a module imports only modules of its own layer or below, so a
change low in the tree cannot pull in a stage, and export and the runtime stay apart. Read from the
source (every import statement, at module level or inside a function), not from what happens to be
imported at run time."""

import ast
import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# lowest first; a module matches the first pattern that names it
LAYERS = [
    ["pipeline", "pipeline.cgroups", "pipeline.cores", "pipeline.errors", "pipeline.progress", "pipeline.precisions", "pipeline.contract",
     "pipeline.int8_weights",
     "pipeline.distributed"],
    ["pipeline.config"],
    ["pipeline.artifacts", "pipeline.model", "pipeline.tokenizer", "pipeline.training"],
    ["pipeline.data", "pipeline.engines", "pipeline.engines.flavours", "pipeline.engines.metadata",
     "pipeline.engines.profiles", "pipeline.engines.builder"],
    ["pipeline.runtime", "pipeline.runtime.*"],
    ["pipeline.accuracy", "pipeline.machine"],
    ["pipeline.finetune", "pipeline.profiling", "pipeline.train_bench", "pipeline.export", "pipeline.export.*",
     "pipeline.engines.stage", "pipeline.validate", "pipeline.polygraphy_check", "pipeline.bench",
     "pipeline.bench_report", "pipeline.doctor", "pipeline.loadtest", "pipeline.triton_repository",
     "pipeline.triton_model", "pipeline.triton_server"],
    ["pipeline.cli", "pipeline.cli_errors", "serve", "serve.*"],
]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    for level, patterns in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(module, p) for p in patterns):
            return level
    raise AssertionError(f"{module} is in no layer of tests/test_layers.py: add it where it belongs")


def project_imports(path: Path) -> set[str]:
    """The project modules a file imports (pipeline.* and serve.*), the deepest module each names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {f"{node.module}.{alias.name}" if is_module(f"{node.module}.{alias.name}") else node.module
                      for alias in node.names}
    return {m for m in found if m.split(".")[0] in ("pipeline", "serve")}


def is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


SOURCES = sorted([*ROOT.glob("pipeline/**/*.py"), *ROOT.glob("serve/**/*.py")])


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_imports_point_down(path):
    here = module_name(path)
    up = sorted(m for m in project_imports(path) if layer_of(m) > layer_of(here))
    assert not up, f"{here} (layer {layer_of(here)}) imports modules above it: {up}"


def test_export_and_the_runtime_do_not_import_each_other():
    for path in SOURCES:
        here, imports = module_name(path), project_imports(path)
        for a, b in (("pipeline.export", "pipeline.runtime"), ("pipeline.runtime", "pipeline.export")):
            if here.startswith(a):
                assert not [m for m in imports if m.startswith(b)], f"{here} imports {b}"


def test_every_module_has_a_layer():
    for path in SOURCES:
        layer_of(module_name(path))


def test_the_layers_catch_an_import_that_points_up(tmp_path):
    """The check reads imports inside functions too: a stage imported lazily by a low module fails."""
    source = tmp_path / "config.py"
    source.write_text("def f():\n    from pipeline.validate import validate\n")
    assert layer_of("pipeline.config") < max(layer_of(m) for m in project_imports(source))

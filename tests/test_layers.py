"""The package's import layers: a module imports only modules of its own layer or below, so a
change low in the tree cannot pull in a stage, and export and the runtime stay apart. Read from the
source (every import statement, at module level or inside a function), not from what happens to be
imported at run time."""

import ast
import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# lowest first; a module matches the first pattern that names it. Folders are layers where they can
# be: training (pipeline/train/) and Triton Inference Server (pipeline/tritonserver/) are stages,
# the runtime one layer, serve/ the top beside the CLI (docs/design.md draws the same map).
LAYERS = [
    ["pipeline", "pipeline.cgroups", "pipeline.cores", "pipeline.errors", "pipeline.progress", "pipeline.precisions",
     "pipeline.contract", "pipeline.int8_weights"],
    ["pipeline.config"],
    ["pipeline.artifacts", "pipeline.model", "pipeline.tokenizer"],
    ["pipeline.data", "pipeline.engines", "pipeline.engines.flavours", "pipeline.engines.metadata",
     "pipeline.engines.profiles", "pipeline.engines.builder"],
    ["pipeline.runtime", "pipeline.runtime.*"],
    ["pipeline.accuracy", "pipeline.machine"],
    ["pipeline.train", "pipeline.train.*", "pipeline.export", "pipeline.export.*", "pipeline.engines.stage",
     "pipeline.validate", "pipeline.polygraphy_check", "pipeline.bench", "pipeline.bench_report", "pipeline.step_cost",
     "pipeline.optimum_compare", "pipeline.optimum_worker", "pipeline.doctor",
     "pipeline.tritonserver", "pipeline.tritonserver.*", "pipeline.engine_process", "pipeline.engine_process.*"],
    ["pipeline.cli", "pipeline.cli_errors", "serve", "serve.*"],
]
# packages only the CLI (and each package itself) may import: the commands they serve are the CLI's
CLI_ONLY = ["pipeline.train", "pipeline.tritonserver"]


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


@pytest.mark.parametrize("package", CLI_ONLY)
def test_only_the_cli_imports_these_packages(package):
    for path in SOURCES:
        here = module_name(path)
        if here == "pipeline.cli" or here == package or here.startswith(package + "."):
            continue
        into = sorted(m for m in project_imports(path) if m == package or m.startswith(package + "."))
        assert not into, f"{here} imports {into}: only pipeline.cli may"


def test_no_two_modules_import_each_other():
    """Layers allow imports within a layer; a circle there (a imports b, b imports a, lazily or not)
    still ties two rooms into one."""
    graph = {module_name(path): {m for m in project_imports(path) if m != module_name(path)} for path in SOURCES}

    def circle_from(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            here, trail = stack.pop()
            for there in graph.get(here, ()):
                if there == start:
                    return trail + [start]
                if there not in seen:
                    seen.add(there)
                    stack.append((there, trail + [there]))
        return None

    circles = [c for m in graph if (c := circle_from(m))]
    assert not circles, f"import circle: {' -> '.join(circles[0])}"


def test_no_module_imports_another_modules_private_names():
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("pipeline", "serve"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{module_name(path)} imports {private} from {node.module}: make them public there"


def test_every_module_has_a_layer():
    for path in SOURCES:
        layer_of(module_name(path))


def test_the_layers_catch_an_import_that_points_up(tmp_path):
    """The check reads imports inside functions too: a stage imported lazily by a low module fails."""
    source = tmp_path / "config.py"
    source.write_text("def f():\n    from pipeline.validate import validate\n")
    assert layer_of("pipeline.config") < max(layer_of(m) for m in project_imports(source))

"""The measurement scripts kept beside the journal (docs/journal/probes/) import what they use from
this package as it is now: a rename or a removed function fails here, not silently months later.
They run by hand (most on a GPU); this checks each parses and that every name it imports from
`pipeline` or `serve` exists."""

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

PROBES = sorted((Path(__file__).resolve().parents[1] / "docs" / "journal" / "probes").rglob("*.py"))


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.relative_to(p.parents[1]).as_posix())
def test_a_probe_imports_names_that_exist(probe):
    tree = ast.parse(probe.read_text(encoding="utf-8"), str(probe))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("pipeline", "serve"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), \
                    f"{probe.name}: {node.module} has no {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ("pipeline", "serve"):
                    importlib.import_module(alias.name)


def test_there_are_probes():
    assert PROBES

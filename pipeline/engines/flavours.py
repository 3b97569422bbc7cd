"""The two TensorRT flavours and how to import them.

`tensorrt` (10.x/11.x) is the datacenter library; `tensorrt_rtx` is TensorRT for RTX, whose Python
module has nearly the same API and which can build engines on a machine with no GPU."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from pipeline.errors import UserError


@dataclass(frozen=True)
class Flavour:
    name: str
    modules: tuple[str, ...]  # import names to try, first found wins
    install: str


FLAVOURS = (
    Flavour("tensorrt", ("tensorrt",),
            "install tensorrt-cu13 (or -cu12) from NVIDIA's own package index, as TensorRT's installation guide "
            "shows, or use a container that ships it"),
    Flavour("tensorrt_rtx", ("tensorrt_rtx", "tensorrt_rtx_bindings"), "pip install 'gpt2-deploy[trt-rtx]'"),
)


def by_name(name: str) -> Flavour:
    for f in FLAVOURS:
        if f.name == name:
            return f
    raise UserError(f"--flavour {name!r}: choose one of {', '.join(f.name for f in FLAVOURS)}, or auto")


def import_flavour(flavour: Flavour) -> ModuleType:
    errors = []
    for module in flavour.modules:
        try:
            return importlib.import_module(module)
        except Exception as e:  # a wheel without its native libraries raises OSError, not ImportError
            errors.append(f"{module}: {type(e).__name__}")
    raise UserError(f"{flavour.name} is not installed ({'; '.join(errors)}); {flavour.install}")


def probe(flavour: Flavour) -> tuple[str, str]:
    """(status, detail) for `doctor`."""
    try:
        trt = import_flavour(flavour)
    except UserError as e:
        return "missing", str(e)
    return "ok", f"{getattr(trt, '__version__', '?')} (module {trt.__name__})"

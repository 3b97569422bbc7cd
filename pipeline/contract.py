"""The ONNX graph contract, as data: every stage that touches a graph (export, build-engine, the
ONNX Runtime and TensorRT backends, validate) derives names, dtypes and dynamic axes from here.

One graph serves prefill (past length 0) and decode. The names are Optimum's, so tools that know
Optimum's decoder exports recognise ours.

Export writes two families of graphs (targets) under this contract: `portable`, standard ONNX whose
present is past + the new tokens (what TensorRT builds from), and `ort`, ONNX Runtime's fused
operators over a cache that past and present share: a buffer of the cache's full length, read and
written in place, each row filled from slot 0 and its length taken from the attention mask."""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from pipeline.errors import UserError

# symbolic axes
BATCH, SEQ, PAST, TOTAL = "batch", "seq", "past", "past_plus_seq"
KV_LENGTH, PRESENT_KV_LENGTH = "kv_length", "present_kv_length"  # the ort target's shared cache buffer
PORTABLE, ORT = "portable", "ort"
TARGETS = (PORTABLE, ORT)
TOKEN_INPUTS = ("input_ids", "attention_mask", "position_ids")  # int64, in this order
LOGITS = "logits"
# the ort target's optional int64 scalar input: logits of the last N positions only, 0 (its default) for
# all, as Hugging Face's logits_to_keep; a prefill that needs the last position skips the LM head elsewhere
LOGITS_TO_KEEP = "logits_to_keep"


@dataclass(frozen=True)
class Tensor:
    name: str
    axes: tuple[str | int, ...]  # symbolic names or fixed sizes
    dtype: str  # "int64", or "model" for the graph's float type


@dataclass(frozen=True)
class Contract:
    n_layer: int
    n_head: int
    head_dim: int
    vocab_size: int
    target: str = PORTABLE

    @property
    def shared_kv(self) -> bool:
        """Whether past and present are one buffer of the cache's full length (the ort target)."""
        return self.target == ORT

    def kv_names(self, prefix: str) -> list[str]:
        return [f"{prefix}.{i}.{kind}" for i in range(self.n_layer) for kind in ("key", "value")]

    @property
    def past_names(self) -> list[str]:
        """The KV inputs, layer i's keys at 2i and values at 2i + 1."""
        return self.kv_names("past_key_values")

    @property
    def present_names(self) -> list[str]:
        """The KV outputs, in past_names' order."""
        return self.kv_names("present")

    @property
    def inputs(self) -> list[Tensor]:
        ids = [Tensor(name, (BATCH, TOTAL if name == "attention_mask" else SEQ), "int64") for name in TOKEN_INPUTS]
        past = KV_LENGTH if self.shared_kv else PAST
        return ids + [Tensor(n, (BATCH, self.n_head, past, self.head_dim), "model") for n in self.past_names]

    @property
    def outputs(self) -> list[Tensor]:
        present = PRESENT_KV_LENGTH if self.shared_kv else TOTAL
        kv = [Tensor(n, (BATCH, self.n_head, present, self.head_dim), "model") for n in self.present_names]
        return [Tensor(LOGITS, (BATCH, SEQ, self.vocab_size), "model")] + kv

    def missing(self, names: set[str]) -> list[str]:
        """The contract's inputs and outputs that are not among names (a session's or an engine's)."""
        return [n for n in self.input_names + self.output_names if n not in names]

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    @classmethod
    def from_hf_config(cls, config, target: str = PORTABLE) -> "Contract":
        return cls(config.n_layer, config.n_head, config.n_embd // config.n_head, config.vocab_size, target)


ONNX_DTYPES = {onnx.TensorProto.INT64: "int64", onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16"}


def graph_io(model: onnx.ModelProto) -> dict[str, tuple[str, tuple]]:
    """{name: (dtype, dims)} of a graph's inputs and outputs; dims are ints or symbol names."""
    found = {}
    for value in list(model.graph.input) + list(model.graph.output):
        t = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim)
        found[value.name] = (ONNX_DTYPES.get(t.elem_type, str(t.elem_type)), dims)
    return found


def check_graph(model: onnx.ModelProto, contract: Contract, where: str) -> str:
    """Verify names, then dtypes, then ranks and fixed sizes; report every mismatch at once.
    Returns the graph's KV/float dtype."""
    io = graph_io(model)
    problems = []
    expected = contract.inputs + contract.outputs
    missing = contract.missing(set(io))
    if missing:
        problems.append(f"missing {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
    kv_dtypes = {io[t.name][0] for t in expected if t.dtype == "model" and t.name in io and t.name != LOGITS}
    if len(kv_dtypes) > 1:
        problems.append(f"mixed KV dtypes {sorted(kv_dtypes)}")
    model_dtype = next(iter(kv_dtypes), "float32")
    for t in expected:
        if t.name not in io:
            continue
        dtype, dims = io[t.name]
        allowed = {"int64"} if t.dtype == "int64" else ({"float32", model_dtype} if t.name == LOGITS else {model_dtype})
        if dtype not in allowed:
            problems.append(f"{t.name} is {dtype}, expected {'/'.join(sorted(allowed))}")
        if len(dims) != len(t.axes):
            problems.append(f"{t.name} has rank {len(dims)}, expected {len(t.axes)}")
        elif any(d != a if isinstance(a, int) else not isinstance(d, str) for a, d in zip(t.axes, dims)):
            # a fixed size must match; a symbolic axis must stay dynamic
            problems.append(f"{t.name} has shape {dims}, expected {t.axes}")
    if problems:
        raise UserError(f"{where}: not a graph of this pipeline's contract ({'; '.join(problems)})")
    return model_dtype

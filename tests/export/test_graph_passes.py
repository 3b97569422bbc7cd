"""The int8 rewrites export applies to ONNX graphs: the per-channel quantiser against its rule written
plainly in torch, and the CPU's dynamic int8 MatMul run by ONNX Runtime against the arithmetic of
ONNX's DynamicQuantizeLinear and an integer matmul, done by hand."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from pipeline.export.graph_passes import symmetric_int8
from pipeline.export.ort_graph import DYNAMIC_INT8_TOP, INT8_MATMULS


@pytest.mark.parametrize("top", [127, DYNAMIC_INT8_TOP])
def test_symmetric_int8_puts_each_output_channels_maximum_at_top_with_no_zero_point(top):
    torch.manual_seed(0)
    w = torch.randn(48, 20)
    w[:, 7] = 0.0
    q, scale = symmetric_int8(w.numpy(), axis=1, top=top)
    assert q.dtype == np.int8 and q.shape == (48, 20) and scale.shape == (20,) and scale.dtype == np.float32
    absmax = w.abs().amax(0)
    expected_scale = torch.where(absmax > 0, absmax / top, torch.ones_like(absmax))
    torch.testing.assert_close(torch.from_numpy(scale), expected_scale, rtol=1e-6, atol=0)
    assert torch.equal(torch.from_numpy(q).long(), torch.clamp(torch.round(w / expected_scale), -top, top).long())
    assert (torch.from_numpy(q).abs().amax(0)[absmax > 0] == top).all()
    assert ((torch.from_numpy(q).float() * expected_scale - w).abs() <= expected_scale / 2 + 1e-6).all()
    assert (q[:, 7] == 0).all() and scale[7] == 1.0
    # axis 0: the channels are rows (a Gemm's transposed weight), the same rule along the other axis
    q0, scale0 = symmetric_int8(w.T.contiguous().numpy(), axis=0, top=top)
    assert np.array_equal(q0, q.T) and np.array_equal(scale0, scale)


def dynamic_quantize_linear(a: np.ndarray) -> tuple[np.ndarray, np.float32, np.uint8]:
    """ONNX's DynamicQuantizeLinear as its specification writes it: uint8, the range widened to hold 0."""
    low, high = min(0.0, float(a.min())), max(0.0, float(a.max()))
    scale = np.float32((high - low) / 255)
    zero_point = np.uint8(np.clip(np.rint(-low / scale), 0, 255))
    return np.clip(np.rint(a / scale) + zero_point, 0, 255).astype(np.uint8), scale, zero_point


def test_the_cpu_int8_pass_makes_each_weights_matmul_the_integer_product_onnx_runtime_computes():
    """A MatMul over a weight (and one over two activations, which must stay) through the pass, then
    ONNX Runtime against the same product done by hand: the 7-bit weights keep MLAS's int16 pair sums
    from saturating, so the integer product is exact on any x86 processor and only float rounding
    differs."""
    rng = np.random.default_rng(0)
    k, n = 96, 40
    w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    w[:, 3] *= 20  # an outlier channel gets its own scale
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="proj"),
         helper.make_node("MatMul", ["x", "other"], ["z"], name="activations")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k]),
              helper.make_tensor_value_info("other", TensorProto.FLOAT, [k, "j"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["m", "j"])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    model = INT8_MATMULS["DynamicQuantizeMatMul"](model)
    onnx.checker.check_model(model)
    assert [node.op_type for node in model.graph.node] == ["DynamicQuantizeMatMul", "MatMul"]
    assert {i.name for i in model.graph.initializer} == {"w_int8", "w_scale"}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    x = rng.standard_normal((5, k)).astype(np.float32)
    x[:, 10] = 30.0  # an outlier feature sets the activations' scale
    y, z = session.run(None, {"x": x, "other": np.eye(k, 2, dtype=np.float32)})
    assert np.array_equal(z, x[:, :2])

    qw, w_scale = symmetric_int8(w, axis=1, top=DYNAMIC_INT8_TOP)
    qx, x_scale, x_zero = dynamic_quantize_linear(x)
    integer = (qx.astype(np.int64) - int(x_zero)) @ qw.astype(np.int64)
    np.testing.assert_allclose(y, integer * (x_scale * w_scale), rtol=1e-5, atol=1e-5 * np.abs(y).max())
    # and what quantising costs against the float product: within a few steps of each scale
    assert np.abs(y - x @ w).max() < 0.05 * np.abs(x @ w).max()

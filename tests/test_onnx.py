"""ONNX export (blockrnn.onnx) and import (blockrnn.convert.from_onnx), judged by ONNX Runtime."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import blockrnn
import blockrnn.onnx as bo
import blockrnn.torch as bt
from blockrnn import convert

SHAPES = [(5, 3, 4, 6), (1, 4, 3, 5), (7, 1, 6, 4), (1, 1, 2, 3), (12, 16, 20, 32)]


def _session(model):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _close(got, want, rel=1e-5):
    """|got - want| <= rel * max|want| elementwise (float32 parity, relative to the scale)."""
    scale = max(float(np.max(np.abs(want), initial=0.0)), 1e-30)
    err = float(np.max(np.abs(got.astype(np.float64) - want), initial=0.0)) / scale
    assert err <= rel, f"relative error {err:.2e} > {rel:.0e}"
    return err


def _layers(I, H):
    return [blockrnn.LSTM(I, H, seed=1), blockrnn.LSTM(I, H, use_peephole=True, seed=2),
            blockrnn.GRU(I, H, seed=3)]


@pytest.mark.parametrize("T,B,I,H", SHAPES)
@pytest.mark.parametrize("with_lengths", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
def test_export_runs_in_onnx_runtime_like_forward(T, B, I, H, with_lengths, with_state):
    rng = np.random.default_rng(T * 100 + B)
    for layer in _layers(I, H):
        model = bo.export(layer, sequence_lens=with_lengths, initial_state=with_state)
        onnx.checker.check_model(model, full_check=True)
        lstm = isinstance(layer, blockrnn.LSTM)
        x = rng.uniform(-1, 1, (T, B, I)).astype(np.float32)
        feed, lengths, state = {"X": x}, None, None
        if with_lengths:
            lengths = rng.integers(1, T + 1, B).astype(np.int32)
            lengths[0] = T
            feed["sequence_lens"] = lengths
        if with_state:
            h0, c0 = rng.uniform(-1, 1, (2, B, H)).astype(np.float32)
            feed["initial_h"] = h0[None]
            if lstm:
                feed["initial_c"] = c0[None]
            state = (h0[None], c0[None]) if lstm else h0[None]      # (L*D, B, H)
        out = _session(model).run(None, feed)
        y, final, _ = layer.forward(x, state, lengths)
        assert out[0].shape == (T, 1, B, H)
        _close(out[0][:, 0], y)
        finals = final if lstm else (final,)
        assert len(out) == 1 + len(finals)
        for got, want in zip(out[1:], finals):
            assert got.shape == want.shape == (1, B, H)
            _close(got, want)


def test_export_torch_modules_and_path(tmp_path):
    T, B, I, H = 6, 3, 5, 4
    x = torch.from_numpy(np.random.default_rng(0).uniform(-1, 1, (T, B, I)).astype(np.float32))
    for module in (bt.LSTM(I, H, use_peephole=True), bt.GRU(I, H), bt.LSTM(I, H)):
        path = tmp_path / f"{type(module).__name__}.onnx"
        model = bo.export(module, path)
        assert onnx.load(str(path)) == model
        with torch.no_grad():
            y, final = module(x)
        out = _session(model).run(None, {"X": x.numpy()})
        _close(out[0][:, 0], y.numpy())
        finals = final if isinstance(final, tuple) else (final,)
        for got, want in zip(out[1:], finals):
            _close(got, want.numpy())


def test_export_batch_first_torch_module_is_time_major():
    T, B, I, H = 4, 2, 3, 5
    module = bt.LSTM(I, H, batch_first=True)
    x = torch.from_numpy(np.random.default_rng(1).uniform(-1, 1, (B, T, I)).astype(np.float32))
    with torch.no_grad():
        y, (h_n, c_n) = module(x)
    out = _session(bo.export(module)).run(None, {"X": x.numpy().transpose(1, 0, 2).copy()})
    _close(out[0][:, 0].transpose(1, 0, 2), y.numpy())
    _close(out[1], h_n.numpy())
    _close(out[2], c_n.numpy())


def test_export_float64_checks_and_dynamic_dims():
    model = bo.export(blockrnn.LSTM(3, 4, dtype=np.float64))
    onnx.checker.check_model(model, full_check=True)
    x = model.graph.input[0].type.tensor_type
    assert x.elem_type == onnx.TensorProto.DOUBLE
    assert [d.dim_param or d.dim_value for d in x.shape.dim] == ["T", "B", 3]
    (node,) = model.graph.node
    assert node.op_type == "LSTM"
    gru = bo.export(blockrnn.GRU(3, 4)).graph.node[0]
    assert {a.name: onnx.helper.get_attribute_value(a) for a in gru.attribute}[
        "linear_before_reset"] == 0


def test_lstm_weights_icfo_and_forget_bias():
    """BlockLSTM's ICFO columns and forget_bias land where IFCO + a folded bias do."""
    rng = np.random.default_rng(4)
    I, H = 3, 2
    w, b = rng.standard_normal((I + H, 4 * H)), rng.standard_normal(4 * H)
    i, c, f, o = np.split(w, 4, axis=1)
    bi, bc, bf, bo_ = np.split(b, 4)
    want = bo.lstm_weights(np.concatenate([i, f, c, o], 1),
                           np.concatenate([bi, bf + 1.5, bc, bo_]))
    got = bo.lstm_weights(w, b, gate_order="ICFO", forget_bias=1.5)
    for g, wt in zip(got[:3], want[:3]):
        np.testing.assert_array_equal(g, wt)
    with pytest.raises(ValueError, match="gate_order must be 'IFCO' or 'ICFO'"):
        bo.lstm_weights(w, b, gate_order="IOFC")


def test_export_refusals():
    with pytest.raises(ValueError, match="cell_clip=2.0 cannot be exported: ONNX's LSTM "
                                         "attribute 'clip' clips the gates' pre-activations"):
        bo.export(blockrnn.LSTM(3, 4, cell_clip=2.0))
    with pytest.raises(ValueError, match="cell_clip=1.0 cannot be exported"):
        bo.export(bt.LSTM(3, 4, cell_clip=1.0))
    with pytest.raises(TypeError, match="model must be a blockrnn.LSTM, .* got Linear"):
        bo.export(torch.nn.Linear(3, 4))


def test_import_blockrnn_does_not_import_onnx():
    import subprocess
    import sys
    code = ("import sys, blockrnn, blockrnn.layers, blockrnn.convert; "
            "bad = [m for m in ('onnx', 'onnxruntime', 'jax', 'torch') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------
# import: blockrnn.convert.from_onnx
# --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_round_trip_is_bit_for_bit(dtype, tmp_path):
    for layer in (blockrnn.LSTM(4, 6, seed=1, dtype=dtype),
                  blockrnn.LSTM(4, 6, use_peephole=True, seed=2, dtype=dtype),
                  blockrnn.GRU(4, 6, seed=3, dtype=dtype)):
        path = tmp_path / "m.onnx"
        back = convert.from_onnx(bo.export(layer, path))
        again = convert.from_onnx(str(path))
        for out in (back, again):
            assert type(out) is type(layer) and out.dtype == layer.dtype
            assert getattr(out, "use_peephole", None) == getattr(layer, "use_peephole", None)
            assert out.params.keys() == layer.params.keys()
            for k, v in layer.params.items():
                np.testing.assert_array_equal(out.params[k], v, err_msg=k)


def _lstm_node_model(I, H, rng, peephole, attrs=None, lengths=False):
    """An ONNX LSTM built with onnx.helper (nonzero Rb, peepholes), as another tool writes."""
    from onnx import TensorProto, helper, numpy_helper
    W, R = rng.uniform(-.5, .5, (1, 4 * H, I)), rng.uniform(-.5, .5, (1, 4 * H, H))
    Bias, P = rng.uniform(-.5, .5, (1, 8 * H)), rng.uniform(-.5, .5, (1, 3 * H))
    inits = [numpy_helper.from_array(a.astype(np.float32), n)
             for a, n in ((W, "W"), (R, "R"), (Bias, "B"), (P, "P"))]
    ins = ["X", "W", "R", "B", "lens" if lengths else ""] + ["", ""] + (["P"] if peephole else [])
    node = helper.make_node("LSTM", ins, ["Y", "Y_h", "Y_c"], name="enc", hidden_size=H,
                            **(attrs or {}))
    graph_inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["T", "B", I])]
    if lengths:
        graph_inputs.append(helper.make_tensor_value_info("lens", TensorProto.INT32, ["B"]))
    graph = helper.make_graph(
        [node], "other", graph_inputs,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in
         (("Y", ["T", 1, "B", H]), ("Y_h", [1, "B", H]), ("Y_c", [1, "B", H]))],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)


@pytest.mark.parametrize("peephole", [False, True])
def test_import_helper_built_lstm_matches_onnx_runtime(peephole):
    rng = np.random.default_rng(5)
    T, B, I, H = 7, 3, 5, 4
    model = _lstm_node_model(I, H, rng, peephole, lengths=True)
    onnx.checker.check_model(model, full_check=True)
    layer = convert.from_onnx(model)
    assert layer.use_peephole == peephole
    x = rng.uniform(-1, 1, (T, B, I)).astype(np.float32)
    lens = np.array([7, 2, 5], np.int32)
    y, h, c = _session(model).run(None, {"X": x, "lens": lens})
    ours, (h_n, c_n), _ = layer.forward(x, None, lens)
    _close(y[:, 0], ours)
    _close(h, h_n)
    _close(c, c_n)


@pytest.mark.filterwarnings("ignore")   # the TorchScript exporter's tracer warnings
def test_import_torch_exported_nn_lstm_matches_onnx_runtime(tmp_path):
    torch.manual_seed(0)
    T, B, I, H = 6, 2, 4, 5
    ref = torch.nn.LSTM(I, H)
    path = tmp_path / "torch_lstm.onnx"
    torch.onnx.export(ref, (torch.zeros(T, B, I),), str(path), dynamo=False,
                      input_names=["x"], output_names=["y", "h", "c"],
                      dynamic_axes={"x": {0: "T", 1: "B"}}, opset_version=14)
    model = onnx.load(str(path))
    assert [n.op_type for n in model.graph.node].count("LSTM") == 1
    layer = convert.from_onnx(path)
    x = np.random.default_rng(6).uniform(-1, 1, (T + 3, B + 1, I)).astype(np.float32)
    y, h, c = _session(model).run(None, {"x": x})
    ours, (h_n, c_n), _ = layer.forward(x)
    _close(y, ours)
    _close(h, h_n)
    _close(c, c_n)


@pytest.mark.parametrize("attrs,match", [
    ({"direction": "bidirectional"}, "direction='bidirectional'; only direction='forward'"),
    ({"direction": "reverse"}, "direction='reverse'"),
    ({"activations": ["Sigmoid", "Relu", "Tanh"]}, "activations=.*Relu"),
    ({"clip": 3.0}, "clip=3.0; ONNX's clip bounds the gates' pre-activations"),
    ({"input_forget": 1}, "input_forget=1"),
    ({"layout": 1}, "layout=1; blockrnn's layers are time-major"),
])
def test_import_refusals_name_the_attribute(attrs, match):
    model = _lstm_node_model(3, 2, np.random.default_rng(0), False, attrs)
    with pytest.raises(ValueError, match=match):
        convert.from_onnx(model)


def test_import_refusals_gru_and_graph():
    model = bo.export(blockrnn.GRU(3, 2))
    model.graph.node[0].attribute.append(onnx.helper.make_attribute("linear_before_reset", 1))
    del model.graph.node[0].attribute[1]   # drop the exporter's linear_before_reset=0
    with pytest.raises(ValueError, match="linear_before_reset=1; that is the reset-after GRU"):
        convert.from_onnx(model)
    two = bo.export(blockrnn.LSTM(3, 2))
    two.graph.node.append(onnx.helper.make_node("GRU", ["X"], ["Z"], name="second"))
    with pytest.raises(ValueError, match="2 LSTM/GRU nodes .*pass node=<name>"):
        convert.from_onnx(two)
    assert isinstance(convert.from_onnx(two, node="lstm"), blockrnn.LSTM)
    with pytest.raises(ValueError, match="no LSTM/GRU node named 'nope'"):
        convert.from_onnx(two, node="nope")
    dynamic = bo.export(blockrnn.LSTM(3, 2))
    dynamic.graph.initializer.pop(0)                                  # W becomes an input
    with pytest.raises(ValueError, match="input W \\('W'\\) is not a constant"):
        convert.from_onnx(dynamic)
    with pytest.raises(TypeError, match="expected an onnx.ModelProto or a path, got int"):
        convert.from_onnx(3)

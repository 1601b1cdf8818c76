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
            blockrnn.GRU(I, H, seed=3), blockrnn.GRU(I, H, reset_after=False, seed=4)]


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
    for module in (bt.LSTM(I, H, use_peephole=True), bt.GRU(I, H, reset_after=False),
                   bt.LSTM(I, H, forget_bias=1.0)):
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
    for reset_after in (False, True):
        gru = bo.export(blockrnn.GRU(3, 4, reset_after=reset_after)).graph.node[0]
        assert {a.name: onnx.helper.get_attribute_value(a) for a in gru.attribute}[
            "linear_before_reset"] == int(reset_after)


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
    ({"direction": "reverse"}, "direction='reverse'; only direction='forward' or "
                               "'bidirectional' converts"),
    ({"direction": "bidirectional"}, r"W \(1, 8, 3\) and R \(1, 8, 2\) do not fit "
                                     r"hidden_size=2 and direction='bidirectional'"),
    ({"activations": ["Sigmoid", "Relu", "Tanh"]}, "activations=.*Relu"),
    ({"clip": 3.0}, "clip=3.0; ONNX's clip bounds the gates' pre-activations"),
    ({"input_forget": 1}, "input_forget=1"),
    ({"layout": 1}, "layout=1; blockrnn's layers are time-major"),
])
def test_import_refusals_name_the_attribute(attrs, match):
    model = _lstm_node_model(3, 2, np.random.default_rng(0), False, attrs)
    with pytest.raises(ValueError, match=match):
        convert.from_onnx(model)


@pytest.mark.parametrize("make", [lambda: blockrnn.LSTM(3, 2, use_peephole=True),
                                  lambda: blockrnn.GRU(3, 2, bidirectional=True),
                                  lambda: blockrnn.GRU(3, 2, reset_after=False)],
                         ids=["lstm_peephole", "gru_bidirectional", "gru_reset_before"])
def test_import_refuses_weights_of_another_shape_or_element_type(make):
    """B and P were read without a check (IndexError, or an AssertionError of _fill, which
    python -O drops), and an integer or mixed-precision W / R / B / P made the layer's
    dtype whatever NumPy's promotion gave (ONNX's node has one float type T)."""
    model = bo.export(make())
    node = next(n for n in model.graph.node if n.op_type in ("LSTM", "GRU"))
    shape = "(must have shape|do not fit hidden_size)"
    for key, name in zip("WRB" + "___P", node.input[1:]):
        if not name:
            continue
        init = next(i for i in model.graph.initializer if i.name == name)
        good = onnx.numpy_helper.to_array(init)
        for bad, match in [(good[0], shape), (good[..., :-1], shape), (good[None], shape),
                           (good.reshape(-1)[:1].reshape(()), shape),
                           (good.astype(np.int32), "has element type int32"),
                           (good.astype(np.float64), "has element type float64")]:
            if key == "W" and bad.ndim == 3 and bad.shape[:2] == good.shape[:2]:
                continue   # a W of another width is a model of another input size
            if key == "W" and bad.dtype == np.float64:
                bad, match = good.astype(np.float16), "input R has element type float32"
            init.CopyFrom(onnx.numpy_helper.from_array(bad, name))
            with pytest.raises(ValueError, match=f"from_onnx: .* node '{node.name}': .*{match}"):
                convert.from_onnx(model)
        init.CopyFrom(onnx.numpy_helper.from_array(good, name))
    convert.from_onnx(model)   # and the model converts again


def test_import_refusals_gru_and_graph():
    model = bo.export(blockrnn.GRU(3, 2))
    for a in model.graph.node[0].attribute:
        if a.name == "linear_before_reset":
            a.i = 2
    with pytest.raises(ValueError, match="linear_before_reset=2; ONNX defines 0"):
        convert.from_onnx(model)
    mixed = bo.export(blockrnn.GRU(3, 2, 2))
    lbr = [n for n in mixed.graph.node if n.op_type == "GRU"][1]
    for a in lbr.attribute:
        if a.name == "linear_before_reset":
            a.i = 0
    with pytest.raises(ValueError, match="GRU node 'gru_l1' has another linear_before_reset "
                                         "than node 'gru_l0'"):
        convert.from_onnx(mixed)
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


# --------------------------------------------------------------------------
# bidirectional and stacked models (issue 21)
# --------------------------------------------------------------------------

def _stacked(kind, L, bidirectional, I, H, seed, **kw):
    cls = blockrnn.LSTM if kind == "lstm" else blockrnn.GRU
    if kind == "lstm_peephole":
        cls, kw = blockrnn.LSTM, dict(kw, use_peephole=True)
    if kind == "gru_reset_before":
        kw = dict(kw, reset_after=False)
    return cls(I, H, L, bidirectional=bidirectional, seed=seed, **kw)


@pytest.mark.parametrize("L,bidirectional", [(1, True), (2, True), (3, False)],
                         ids=["bidirectional", "2-layer-bidirectional", "3-layer"])
@pytest.mark.parametrize("kind", ["lstm", "lstm_peephole", "gru", "gru_reset_before"])
@pytest.mark.parametrize("with_lengths,with_state", [(False, False), (True, True),
                                                     (True, False)])
def test_bidirectional_and_stacked_export_run_in_onnx_runtime(kind, L, bidirectional,
                                                             with_lengths, with_state):
    T, B, I, H = 6, 4, 3, 5
    D = 2 if bidirectional else 1
    layer = _stacked(kind, L, bidirectional, I, H, seed=L)
    model = bo.export(layer, sequence_lens=with_lengths, initial_state=with_state)
    rnns = [n for n in model.graph.node if n.op_type in ("LSTM", "GRU")]
    assert len(rnns) == L                         # one node per layer, joined by
    assert [n.op_type for n in model.graph.node].count("Transpose") == L - 1  # Transpose
    assert [n.op_type for n in model.graph.node].count("Reshape") == L - 1    # + Reshape
    for n in rnns:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        assert attrs["direction"] == (b"bidirectional" if bidirectional else b"forward")
        assert list(n.input[4:5]) == (["sequence_lens"] if with_lengths else [""] * (
            len(n.input) > 4))
    W0 = {t.name: t for t in model.graph.initializer}[rnns[0].input[1]]
    assert tuple(W0.dims) == (D, (4 if "lstm" in kind else 3) * H, I)
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, (T, B, I)).astype(np.float32)
    n_states = 1 if kind.startswith("gru") else 2
    feed, lengths, state = {"X": x}, None, None
    if with_lengths:
        lengths = np.array([6, 1, 3, 5], np.int32)           # unsorted, with a length-1 row
        feed["sequence_lens"] = lengths
    if with_state:
        s0 = [rng.uniform(-1, 1, (L * D, B, H)).astype(np.float32) for _ in range(n_states)]
        feed.update(zip(("initial_h", "initial_c"), s0))
        state = s0[0] if kind.startswith("gru") else tuple(s0)
    out = _session(model).run(None, feed)
    y, final, _ = layer.forward(x, state, lengths)
    assert out[0].shape == (T, D, B, H)
    _close(out[0].transpose(0, 2, 1, 3).reshape(T, B, D * H), y)
    finals = (final,) if kind.startswith("gru") else final
    assert len(out) == 1 + n_states
    for got, want in zip(out[1:], finals):
        assert got.shape == want.shape == (L * D, B, H)
        _close(got, want)


@pytest.mark.parametrize("kind", ["lstm", "gru", "gru_reset_before"])
def test_onnx_runtime_reverse_direction_reverses_each_rows_valid_prefix(kind):
    """ORT's reverse direction with sequence_lens = blockrnn's op on reverse_sequence'd
    input, reversed back: row b reads steps n_b - 1 .. 0, and its padding stays zero."""
    T, B, I, H = 5, 3, 2, 4
    layer = _stacked(kind, 1, True, I, H, seed=9)
    lengths = np.array([2, 5, 1], np.int32)
    x = np.random.default_rng(8).uniform(-1, 1, (T, B, I)).astype(np.float32)
    y_ort = _session(bo.export(layer, sequence_lens=True)).run(
        None, {"X": x, "sequence_lens": lengths})[0]
    p, z = layer.params, np.zeros((B, H), np.float32)
    xr = blockrnn.reverse_sequence(x, lengths)
    if kind == "lstm":
        zh = np.zeros(H, np.float32)
        rev = blockrnn.block_lstm_v2(T, xr, z, z, p["w_l0_reverse"], zh, zh, zh,
                                     p["b_l0_reverse"], sequence_length=lengths).h
    elif kind == "gru":
        rev = blockrnn.block_gru_reset_after(T, xr, z, *(p[f"{n}_l0_reverse"] for n in (
            "weight_ih", "weight_hh", "bias_ih", "bias_hh")), sequence_length=lengths).h
    else:
        rev = blockrnn.block_gru(T, xr, z, *(p[f"{n}_l0_reverse"] for n in
                                             ("w_ru", "w_c", "b_ru", "b_c")),
                                 sequence_length=lengths).h
    _close(y_ort[:, 1], blockrnn.reverse_sequence(rev, lengths))
    assert not np.any(y_ort[2:, 1, 0]) and not np.any(y_ort[1:, 1, 2])
    # reversing the whole padded sequence instead would differ (row 0 has length 2 < T)
    whole = blockrnn.reverse_sequence(x)
    assert not np.allclose(whole[:, 0], xr[:, 0])
    # ORT's reverse output at step 0 of row 0 has read x[1, 0] (the row's last valid step)
    x2 = x.copy()
    x2[1, 0] += 1
    y2 = _session(bo.export(layer, sequence_lens=True)).run(
        None, {"X": x2, "sequence_lens": lengths})[0]
    assert np.all(y2[0, 1, 0] != y_ort[0, 1, 0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["lstm", "lstm_peephole", "gru", "gru_reset_before"])
@pytest.mark.parametrize("L,bidirectional", [(1, True), (2, True), (3, False)])
def test_stacked_round_trip_is_bit_for_bit(kind, L, bidirectional, dtype):
    layer = _stacked(kind, L, bidirectional, 4, 3, seed=5, dtype=dtype)
    back = convert.from_onnx(bo.export(layer, sequence_lens=True, initial_state=True))
    assert type(back) is type(layer) and back.dtype == layer.dtype
    assert getattr(back, "reset_after", None) == getattr(layer, "reset_after", None)
    assert (back.num_layers, back.bidirectional) == (L, bidirectional)
    assert getattr(back, "use_peephole", None) == getattr(layer, "use_peephole", None)
    assert list(back.params) == list(layer.params)
    for k, v in layer.params.items():
        np.testing.assert_array_equal(back.params[k], v, err_msg=k)
    # node= still picks one node of the chain: a one-layer layer
    one = convert.from_onnx(bo.export(layer), node=f"{kind[:4].replace('_', '')}_l0"
                            if L > 1 else None)
    assert one.num_layers == 1 and one.bidirectional == bidirectional
    for k, v in one.params.items():
        np.testing.assert_array_equal(v, layer.params[k], err_msg=k)


def test_export_stacked_torch_module():
    T, B, I, H = 5, 3, 4, 3
    torch.manual_seed(2)
    module = bt.LSTM(I, H, 2, bias=False, bidirectional=True, dropout=0.5).eval()
    x = torch.from_numpy(np.random.default_rng(3).uniform(-1, 1, (T, B, I)).astype(np.float32))
    with torch.no_grad():
        y, (h_n, c_n) = module(x)
    out = _session(bo.export(module)).run(None, {"X": x.numpy()})
    _close(out[0].transpose(0, 2, 1, 3).reshape(T, B, 2 * H), y.numpy())
    _close(out[1], h_n.numpy())
    _close(out[2], c_n.numpy())


@pytest.mark.filterwarnings("ignore")   # the TorchScript exporter's tracer warnings
@pytest.mark.parametrize("bidirectional", [True, False])
def test_import_torch_exported_stacked_nn_lstm(bidirectional, tmp_path):
    """PyTorch's exporter joins the layers of a stacked nn.LSTM with Transpose + Reshape
    (bidirectional) or Squeeze (one direction); from_onnx reads the chain as one layer."""
    torch.manual_seed(1)
    T, B, I, H = 6, 2, 4, 5
    ref = torch.nn.LSTM(I, H, num_layers=2, bidirectional=bidirectional)
    path = tmp_path / "stacked.onnx"
    torch.onnx.export(ref, (torch.zeros(T, B, I),), str(path), dynamo=False,
                      input_names=["x"], output_names=["y", "h", "c"],
                      dynamic_axes={"x": {0: "T", 1: "B"}}, opset_version=14)
    layer = convert.from_onnx(path)
    assert (layer.num_layers, layer.bidirectional) == (2, bidirectional)
    direct = convert.from_torch(ref)
    for k, v in direct.params.items():
        np.testing.assert_allclose(layer.params[k], v, rtol=0, atol=1e-6, err_msg=k)
    x = np.random.default_rng(6).uniform(-1, 1, (T + 2, B + 1, I)).astype(np.float32)
    y, h, c = _session(onnx.load(str(path))).run(None, {"x": x})
    ours, (h_n, c_n), _ = layer.forward(x)
    _close(y, ours)
    _close(h, h_n)
    _close(c, c_n)


def test_import_refuses_nodes_that_are_not_one_stack():
    two = bo.export(blockrnn.LSTM(3, 2, 2))
    two.graph.node.append(onnx.helper.make_node("LSTM", ["X", "W_l0", "R_l0"], ["Z"],
                                                name="side", hidden_size=2))
    with pytest.raises(ValueError, match=r"3 LSTM/GRU nodes \(\['lstm_l0', 'lstm_l1', "
                                         r"'side'\]\) that are not one stacked layer \(2 of "
                                         r"them read the graph's input\); pass node=<name>"):
        convert.from_onnx(two)
    assert convert.from_onnx(two, node="lstm_l1").input_size == 2
    swapped = bo.export(blockrnn.GRU(3, 2, 2, bidirectional=True))
    (t,) = [n for n in swapped.graph.node if n.op_type == "Transpose"]
    del t.attribute[:]
    t.attribute.append(onnx.helper.make_attribute("perm", [0, 1, 2, 3]))  # (T, D, B, H) kept
    with pytest.raises(ValueError, match="not one stacked layer \\(node 'gru_l1''s X comes "
                                         "from an unexpected Reshape\\)"):
        convert.from_onnx(swapped)


@pytest.mark.filterwarnings("ignore")   # the TorchScript exporter's tracer warnings
@pytest.mark.parametrize("L,bidirectional,bias", [(1, False, True), (2, True, True),
                                                  (2, False, False)])
def test_import_torch_exported_nn_gru(L, bidirectional, bias, tmp_path):
    """PyTorch's exporter writes nn.GRU as GRU nodes with linear_before_reset=1: from_onnx
    gives the reset-after layer of from_torch's weights, and ONNX Runtime's output."""
    torch.manual_seed(3)
    T, B, I, H = 6, 3, 4, 5
    ref = torch.nn.GRU(I, H, num_layers=L, bidirectional=bidirectional, bias=bias)
    path = tmp_path / "gru.onnx"
    torch.onnx.export(ref, (torch.zeros(T, B, I),), str(path), dynamo=False,
                      input_names=["x"], output_names=["y", "h"],
                      dynamic_axes={"x": {0: "T", 1: "B"}}, opset_version=14)
    layer = convert.from_onnx(path)
    assert isinstance(layer, blockrnn.GRU) and layer.reset_after
    assert (layer.num_layers, layer.bidirectional) == (L, bidirectional)
    direct = convert.from_torch(ref)
    for k, v in direct.params.items():
        np.testing.assert_allclose(layer.params[k], v, rtol=0, atol=1e-6, err_msg=k)
    x = np.random.default_rng(6).uniform(-1, 1, (T + 2, B + 1, I)).astype(np.float32)
    y, h = _session(onnx.load(str(path))).run(None, {"x": x})
    ours, h_n, _ = layer.forward(x)
    _close(y, ours)
    _close(h, h_n)


@pytest.mark.parametrize("L,bidirectional", [(1, False), (2, True)])
def test_export_reset_after_gru_runs_in_onnx_runtime_like_nn_gru(L, bidirectional):
    """The exported reset-after layer (linear_before_reset=1) in ONNX Runtime = nn.GRU
    with the layer's weights (the same parameter names), with sequence_lens and a state."""
    T, B, I, H = 6, 4, 3, 5
    D = 2 if bidirectional else 1
    layer = blockrnn.GRU(I, H, L, bidirectional=bidirectional, seed=11)
    rng = np.random.default_rng(12)
    for p in layer.params.values():          # biases of both kinds far from zero
        p += rng.uniform(-0.5, 0.5, p.shape).astype(p.dtype)
    ref = torch.nn.GRU(I, H, L, bidirectional=bidirectional)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.copy_(torch.from_numpy(layer.params[name]))
    x = rng.uniform(-1, 1, (T, B, I)).astype(np.float32)
    h0 = rng.uniform(-1, 1, (L * D, B, H)).astype(np.float32)
    out = _session(bo.export(layer, initial_state=True)).run(None, {"X": x, "initial_h": h0})
    with torch.no_grad():
        y_t, h_t = ref(torch.from_numpy(x), torch.from_numpy(h0))
    _close(out[0].transpose(0, 2, 1, 3).reshape(T, B, D * H), y_t.numpy())
    _close(out[1], h_t.numpy())
    lengths = np.array([6, 1, 3, 5], np.int32)
    out = _session(bo.export(layer, sequence_lens=True)).run(
        None, {"X": x, "sequence_lens": lengths})
    y, h_n, _ = layer.forward(x, None, lengths)
    _close(out[0].transpose(0, 2, 1, 3).reshape(T, B, D * H), y)
    _close(out[1], h_n)


# --------------------------------------------------------------------------
# torch's default (dynamo) exporter (issue 27, point 5)
# --------------------------------------------------------------------------

def _dynamo(kind, L, bidirectional, batch_first, with_state, bias, dtype=torch.float32,
            T=5, B=2, I=3, H=4, **export_kw):
    """An nn.LSTM / nn.GRU and its graph by torch.onnx.export(..., dynamo=True) (opset 20:
    Transpose(perm [0, 2, 1, 3]) + Reshape between the layers, weights folded into
    initializers unless optimize=False, nn.GRU as GRU with linear_before_reset=1)."""
    torch.manual_seed(L + 2 * bidirectional + 4 * batch_first + 8 * with_state + 16 * bias)
    ref = getattr(torch.nn, kind)(I, H, num_layers=L, bidirectional=bidirectional,
                                  batch_first=batch_first, bias=bias).to(dtype)
    x = torch.zeros((B, T, I) if batch_first else (T, B, I), dtype=dtype)
    h0 = torch.zeros((1 + bidirectional) * L, B, H, dtype=dtype)
    args = (x, (h0, h0.clone()) if kind == "LSTM" else h0) if with_state else (x,)
    model = torch.onnx.export(ref, args, dynamo=True, verbose=False, **export_kw).model_proto
    return ref, model


def _against_torch(ref, layer, kind, rel, T=7, B=3):
    """layer.forward against ref (an nn.LSTM / nn.GRU) from a random initial state, on a
    shape other than the exported one; time-major for layer, ref's own layout for ref."""
    D, L, H = 1 + ref.bidirectional, ref.num_layers, ref.hidden_size
    npd = np.float64 if layer.dtype == np.float64 else np.float32
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (T, B, ref.input_size)).astype(npd)
    h0, c0 = (rng.uniform(-1, 1, (L * D, B, H)).astype(npd) for _ in range(2))
    with torch.no_grad():
        xt = torch.from_numpy(x).transpose(0, 1) if ref.batch_first else torch.from_numpy(x)
        h0t, c0t = torch.from_numpy(h0), torch.from_numpy(c0)
        y, state = ref(xt, (h0t, c0t) if kind == "LSTM" else h0t)
        y = y.transpose(0, 1) if ref.batch_first else y
    ours, our_state, _ = layer.forward(x, (h0, c0) if kind == "LSTM" else h0)
    _close(ours, y.numpy(), rel)
    for got, want in zip(our_state if kind == "LSTM" else [our_state],
                         state if kind == "LSTM" else [state]):
        _close(got, want.numpy(), rel)


# Every value of each setting appears; with_state and bias vary against the others.
DYNAMO_CASES = [(L, bi, bf, bf != bi, L == 1 or bi) for L in (1, 2) for bi in (False, True)
                for bf in (False, True)]


@pytest.mark.filterwarnings("ignore")   # the exporter's warnings about nn.RNN's weights
@pytest.mark.parametrize("L,bidirectional,batch_first,with_state,bias", DYNAMO_CASES)
def test_import_dynamo_exported_nn_lstm(L, bidirectional, batch_first, with_state, bias):
    ref, model = _dynamo("LSTM", L, bidirectional, batch_first, with_state, bias)
    assert [n.op_type for n in model.graph.node].count("LSTM") == L
    layer = convert.from_onnx(model)
    assert (layer.num_layers, layer.bidirectional, layer.dtype) == (L, bidirectional,
                                                                     np.float32)
    direct = convert.from_torch(ref)
    for k, v in direct.params.items():
        np.testing.assert_allclose(layer.params[k], v, rtol=0, atol=1e-6, err_msg=k)
    _against_torch(ref, layer, "LSTM", 1e-5)


@pytest.mark.filterwarnings("ignore")   # the exporter's warnings about nn.RNN's weights
@pytest.mark.parametrize("variant", ["float64", "dynamic_shapes", "optimize=False"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_import_dynamo_exported_nn_lstm_variants(variant, batch_first):
    """A float64 module (1e-10); T and B left dynamic (the link's Reshape target is then
    computed from Shape, Slice, Mul, Concat); optimize=False (the weights are Slice and
    Concat of the parameters, sliced by Shape(h0)[2] with an initial state)."""
    T, B = torch.export.Dim("T"), torch.export.Dim("B")
    kw = {"float64": {"dtype": torch.float64},
          "dynamic_shapes": {"dynamic_shapes": (
              {0: B, 1: T} if batch_first else {0: T, 1: B}, ({1: B},) * 2)},
          "optimize=False": {"optimize": False}}[variant]
    ref, model = _dynamo("LSTM", 2, True, batch_first, True, True, **kw)
    if variant == "dynamic_shapes":
        assert "Shape" in [n.op_type for n in model.graph.node]
    layer = convert.from_onnx(model)
    assert (layer.num_layers, layer.bidirectional) == (2, True)
    _against_torch(ref, layer, "LSTM", 1e-10 if variant == "float64" else 1e-5)


@pytest.mark.filterwarnings("ignore")   # the exporter's warnings about nn.RNN's weights
@pytest.mark.parametrize("L,bidirectional,batch_first,with_state,bias", DYNAMO_CASES[1::2])
def test_import_dynamo_exported_nn_gru(L, bidirectional, batch_first, with_state, bias):
    """nn.GRU is written as GRU nodes with linear_before_reset=1 (reset after the
    recurrent product), chained like the LSTM's. Until blockrnn has the reset-after
    GRU, from_onnx recognises the chain and refuses that attribute; with it (branch
    i27-gru: block_gru_reset_after, blockrnn.GRU(reset_after=True)) the graph imports
    and runs like nn.GRU."""
    ref, model = _dynamo("GRU", L, bidirectional, batch_first, with_state, bias)
    rnns = [n for n in model.graph.node if n.op_type == "GRU"]
    assert len(rnns) == L
    assert all(convert._onnx_attrs(n)["linear_before_reset"] == 1 for n in rnns)
    if L > 1:   # the chain is recognised, in layer order, whatever the node conversion says
        chain = convert._onnx_chain(model, rnns[::-1], convert._onnx_tensors(model.graph),
                                    "test")
        assert [n.name for n in chain] == [n.name for n in rnns]
    if not hasattr(blockrnn, "block_gru_reset_after"):
        with pytest.raises(ValueError, match=f"GRU node '{rnns[0].name}' has "
                                             f"linear_before_reset=1; that is the reset-after"):
            convert.from_onnx(model)
        return
    layer = convert.from_onnx(model)
    assert (layer.num_layers, layer.bidirectional, layer.reset_after) == (L, bidirectional,
                                                                          True)
    _against_torch(ref, layer, "GRU", 1e-5)


@pytest.mark.filterwarnings("ignore")   # the exporter's warnings about nn.RNN's weights
def test_import_dynamo_link_refusals():
    """The link between two dynamo-exported layers, altered: each alteration that changes
    what node 2 reads is refused, naming the op; one that does not (an Identity, a
    Reshape target written with 0 and -1) is followed."""
    _, model = _dynamo("LSTM", 2, True, False, False, True)
    (reshape,) = [n for n in model.graph.node if n.op_type == "Reshape"
                  and n.output[0] != model.graph.output[0].name]
    (transpose,) = [n for n in model.graph.node if n.op_type == "Transpose"
                    and n.output[0] == reshape.input[0]]
    second = [n for n in model.graph.node if n.op_type == "LSTM"][1].name

    def altered(change):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        change(m, next(n for n in m.graph.node if n.name == reshape.name),
               next(n for n in m.graph.node if n.name == transpose.name))
        return m

    def target(values):
        def change(m, r, t):
            m.graph.initializer.append(onnx.numpy_helper.from_array(
                np.array(values, np.int64), "altered_shape"))
            r.input[1] = "altered_shape"
        return change

    def perm(values):
        def change(m, r, t):
            del t.attribute[:]
            t.attribute.append(onnx.helper.make_attribute("perm", values))
        return change

    def identity(m, r, t):
        i = onnx.helper.make_node("Identity", [r.output[0]], ["altered_x"], name="ident")
        m.graph.node.insert(list(m.graph.node).index(r) + 1, i)
        nxt = next(n for n in m.graph.node if n.name == second)
        nxt.input[0] = "altered_x"

    def add(m, r, t):
        a = onnx.helper.make_node("Add", [r.output[0], r.output[0]], ["altered_x"], name="add")
        m.graph.node.insert(list(m.graph.node).index(r) + 1, a)
        nxt = next(n for n in m.graph.node if n.name == second)
        nxt.input[0] = "altered_x"

    for ok in (target([0, 0, -1]), target([5, -1, 8]), target([-1, 2, 8]), identity):
        assert convert.from_onnx(altered(ok)).num_layers == 2
    for bad, op in ((target([2, 5, 8]), "Reshape"), (target([5, 2, 2, 4]), "Reshape"),
                    (target([10, 8]), "Reshape"), (perm([0, 1, 2, 3]), "Reshape"),
                    (perm([2, 0, 1, 3]), "Reshape")):
        with pytest.raises(ValueError, match=f"not one stacked layer \\(node '{second}''s X "
                                             f"comes from an unexpected {op}\\)"):
            convert.from_onnx(altered(bad))
    with pytest.raises(ValueError, match=f"node '{second}''s X comes from a Add node"):
        convert.from_onnx(altered(add))


def _relinked(layer, link):
    """blockrnn.onnx.export(layer) (2 layers) with its Transpose + Reshape link replaced by
    ``link(h, y, x)``: nodes and initializers that make tensor x (node 2's X) of y."""
    model = bo.export(layer)
    g = model.graph
    keep = [n for n in g.node if n.op_type not in ("Transpose", "Reshape")]
    nodes, inits = link(onnx.helper, "Y_l0", "X_l1")
    del g.node[:]
    g.node.extend(keep[:1] + nodes + keep[1:])
    g.initializer.extend(onnx.numpy_helper.from_array(np.array(v, np.int64), k)
                         for k, v in inits.items())
    return model


def test_import_follows_any_link_that_computes_t_b_dh():
    """Node 2's X is node 1's Y (T, D, B, H) as (T, B, D*H) through any layout ops
    (followed symbolically, a Reshape target included); any other link is refused
    naming the op that breaks it."""
    uni = blockrnn.LSTM(3, 2, 2, seed=4)
    bi = blockrnn.GRU(3, 2, 2, bidirectional=True, seed=5)

    def squeeze_unsqueeze(h, y, x):        # (T,1,B,H) -> (T,B,H) -> (1,T,B,H) -> (T,B,H)
        return [h.make_node("Squeeze", [y, "one"], ["a"]),
                h.make_node("Unsqueeze", ["a", "zero"], ["b"]),
                h.make_node("Identity", ["b"], ["c"]),
                h.make_node("Squeeze", ["c", "zero"], [x])], {"one": [1], "zero": [0]}

    def shape_gather(h, y, x):             # target [Shape[0], Shape[1], Shape[2] * Shape[3]]
        return [h.make_node("Transpose", [y], ["t"], perm=[0, 2, 1, 3]),
                h.make_node("Shape", ["t"], ["s"]),
                h.make_node("Gather", ["s", "tb"], ["s_tb"]),
                h.make_node("Slice", ["s", "two", "four"], ["s_dh"]),
                h.make_node("Gather", ["s_dh", "zero"], ["d"]),
                h.make_node("Gather", ["s_dh", "one"], ["hh"]),
                h.make_node("Mul", ["d", "hh"], ["dh"]),
                h.make_node("Concat", ["s_tb", "dh"], ["target"], axis=0),
                h.make_node("Reshape", ["t", "target"], [x])], {
            "tb": [0, 1], "two": [2], "four": [4], "zero": [0], "one": [1]}

    for layer, link in ((uni, squeeze_unsqueeze), (uni, shape_gather), (bi, shape_gather)):
        back = convert.from_onnx(_relinked(layer, link))
        assert back.num_layers == 2
        for k, v in layer.params.items():
            np.testing.assert_array_equal(back.params[k], v, err_msg=k)

    def squeeze_b(h, y, x):                # (T,1,B,H) squeezed at B: not size 1
        return [h.make_node("Squeeze", [y, "two"], [x])], {"two": [2]}

    def b_major(h, y, x):                  # [Shape[1], Shape[0], D*H]: rows for steps
        return [h.make_node("Transpose", [y], ["t"], perm=[0, 2, 1, 3]),
                h.make_node("Shape", ["t"], ["s"]),
                h.make_node("Gather", ["s", "bt"], ["s_bt"]),
                h.make_node("Concat", ["s_bt", "minus"], ["target"], axis=0),
                h.make_node("Reshape", ["t", "target"], [x])], {"bt": [1, 0], "minus": [-1]}

    def from_input(h, y, x):               # target from the graph input's shape
        return [h.make_node("Transpose", [y], ["t"], perm=[0, 2, 1, 3]),
                h.make_node("Shape", ["X"], ["s"]),
                h.make_node("Slice", ["s", "zero", "two"], ["s_tb"]),
                h.make_node("Concat", ["s_tb", "minus"], ["target"], axis=0),
                h.make_node("Reshape", ["t", "target"], [x])], {
            "zero": [0], "two": [2], "minus": [-1]}

    for layer, link, op in ((uni, squeeze_b, "Squeeze"), (bi, b_major, "Reshape"),
                            (bi, from_input, "Shape")):
        with pytest.raises(ValueError, match=f"node '{layer.__class__.__name__.lower()}_l1''s"
                                             f" X comes from an unexpected {op}\\)"):
            convert.from_onnx(_relinked(layer, link))


# --------------------------------------------------------------------------
# torch.onnx.export of a whole model holding blockrnn.torch modules
# --------------------------------------------------------------------------

class _Tagger(torch.nn.Module):
    """Embedding -> recurrent layer -> Linear, as a user's model holds nn.LSTM / nn.GRU."""

    def __init__(self, rnn, vocab=20):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, rnn.input_size)
        self.rnn = rnn
        width = (rnn.proj_size if getattr(rnn, "proj_size", 0) else rnn.hidden_size)
        self.out = torch.nn.Linear(width * (1 + rnn.bidirectional), 4)

    def forward(self, tokens):
        y, _ = self.rnn(self.emb(tokens))
        return self.out(y)


TORCH_EXPORT_CASES = [
    ("LSTM", dict(num_layers=2, bidirectional=True, batch_first=True)),
    ("LSTM", dict(bias=False)),
    ("LSTM", dict(forget_bias=1.0)),      # blockrnn's: added to the f rows of b_ih
    ("GRU", dict(num_layers=2, batch_first=True)),
    ("GRU", dict(bidirectional=True, bias=False)),
]


def _root_causes(exc):
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


@pytest.mark.filterwarnings("ignore")   # the exporters' own warnings
@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
@pytest.mark.parametrize("kind,config", TORCH_EXPORT_CASES,
                         ids=[f"{k}-{'-'.join(f'{a}={v}' for a, v in c.items())}"
                              for k, c in TORCH_EXPORT_CASES])
def test_torch_onnx_export_of_a_model_holding_the_modules(kind, config, dynamo, tmp_path):
    """torch.onnx.export of a whole model holding a blockrnn.torch layer runs, with either
    exporter, and writes what it writes for nn.LSTM / nn.GRU (the module runs nn's own op
    under export; the custom ops have no ONNX form): the same node types as the model
    holding nn's layer with the same state_dict, and ONNX Runtime's answer equals the
    module's eager one. (It raised: no ONNX function for blockrnn.lstm.)"""
    torch.manual_seed(0)
    model = _Tagger(getattr(bt, kind)(6, 5, **config)).eval()
    batch_first = config.get("batch_first", False)
    tokens = torch.randint(0, 20, (3, 7) if batch_first else (7, 3))
    path = tmp_path / "model.onnx"
    torch.onnx.export(model, (tokens,), str(path), dynamo=dynamo)
    graph = onnx.load(str(path))
    ops = sorted(n.op_type for n in graph.graph.node)
    assert ops.count(kind) == config.get("num_layers", 1)
    assert not any(n.domain == "blockrnn" or "blockrnn" in n.op_type for n in graph.graph.node)
    sess = _session(graph)
    got = sess.run(None, {sess.get_inputs()[0].name: tokens.numpy()})[0]
    with torch.no_grad():
        want = model(tokens).numpy()
    _close(got, want)
    if "forget_bias" in config:     # (nn.LSTM has no forget bias to compare with)
        return
    nn_kw = {k: v for k, v in config.items()}
    theirs = _Tagger(getattr(torch.nn, kind)(6, 5, **nn_kw)).eval()
    theirs.load_state_dict(model.state_dict())
    nn_path = tmp_path / "nn.onnx"
    torch.onnx.export(theirs, (tokens,), str(nn_path), dynamo=dynamo)
    assert sorted(n.op_type for n in onnx.load(str(nn_path)).graph.node) == ops


REFUSED_EXPORTS = [
    ("peepholes", lambda: bt.LSTM(6, 5, use_peephole=True), {}),
    ("cell clipping", lambda: bt.LSTM(6, 5, cell_clip=1.0), {}),
    ("reset gate before", lambda: bt.GRU(6, 5, reset_after=False), {}),
    ("projection", lambda: bt.LSTM(6, 5, proj_size=2), {}),
    ("sequence_length", lambda: bt.LSTM(6, 5), {"sequence_length": torch.tensor([7, 2, 5])}),
    ("sequence_length", lambda: bt.GRU(6, 5), {"sequence_length": torch.tensor([7, 2, 5])}),
    ("PackedSequence", lambda: bt.LSTM(6, 5), {"packed": [7, 2, 5]}),
]


@pytest.mark.filterwarnings("ignore")   # the exporters' own warnings
@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
@pytest.mark.parametrize("what,make,kwargs", REFUSED_EXPORTS,
                         ids=[f"{w}-{i}" for i, (w, _, _) in enumerate(REFUSED_EXPORTS)])
def test_torch_onnx_export_refuses_what_nn_cannot_express(what, make, kwargs, dynamo,
                                                           tmp_path):
    """Under torch.onnx.export a configuration nn's op cannot express raises a ValueError
    that says what and what to do (blockrnn.onnx.export), with either exporter (the
    dynamo exporter wraps it; its fallback to torch.compile's tracer raises it too)."""
    layer = make()

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, x):
            if "packed" in kwargs:
                x = torch.nn.utils.rnn.pack_padded_sequence(x, kwargs["packed"],
                                                            enforce_sorted=False)
                return self.layer(x)[0].data
            return self.layer(x, **kwargs)[0]

    with pytest.raises(Exception) as info:
        torch.onnx.export(Wrap().eval(), (torch.zeros(7, 3, 6),), str(tmp_path / "m.onnx"),
                          dynamo=dynamo)
    if what == "PackedSequence" and dynamo:
        return   # torch.export fails before the layer runs, as with nn.LSTM (unpacking)
    ours = [e for e in _root_causes(info.value) if isinstance(e, ValueError)
            and "torch.onnx.export writes nn." in str(e)]
    assert ours and what in str(ours[0]), repr(info.value)[:500]

"""ONNX export: a blockrnn LSTM or GRU as one standard ONNX ``LSTM`` / ``GRU`` node.

Optional: needs the ``onnx`` package (``import blockrnn`` never imports it;
this module does). ``blockrnn.convert.from_onnx`` reads such a node back.

``export(model, path=None, *, sequence_lens=False, initial_state=False)``
takes a ``blockrnn.LSTM`` / ``blockrnn.GRU`` (NumPy) or a
``blockrnn.torch.LSTM`` / ``blockrnn.torch.GRU`` and returns the
``onnx.ModelProto`` (also written to ``path`` when given). The graph is one
node, forward direction, time-major (ONNX ``layout=0``; a ``batch_first``
torch module is exported time-major too), with dynamic ``T`` and ``B``:

* inputs: ``X`` (T, B, I); with ``sequence_lens=True`` also ``sequence_lens``
  (B,) int32 (ONNX Runtime wants every entry in [1, T]); with
  ``initial_state=True`` also ``initial_h`` (1, B, H) and, for the LSTM,
  ``initial_c`` (1, B, H). Left out, they are zeros / full length.
* outputs: ``Y`` (T, 1, B, H) (zero past a row's length), ``Y_h`` (1, B, H)
  and, for the LSTM, ``Y_c`` (1, B, H): the states after each row's last step.

Layouts. ONNX's LSTM stacks its gates i, o, f, c (``W`` (1, 4H, I), ``R``
(1, 4H, H), ``B`` (1, 8H) = [Wb; Rb], peepholes ``P`` (1, 3H) = [p_i, p_o, p_f]);
TensorFlow's ``w`` (I+H, 4H) has gate columns IFCO (BlockLSTMV2, the layers)
or ICFO (BlockLSTM), and BlockLSTM adds ``forget_bias`` to the forget gate's
pre-activation, which goes into the forget gate's ``Wb``. ONNX's GRU stacks z,
r, h with ``h' = (1 - z) * h~ + z * h``: TensorFlow's update gate u is z, and
``linear_before_reset=0`` is GRUBlockCell's reset-before candidate
``c = tanh([x, r * h] @ w_c + b_c)``.

Refused with a ValueError: ``cell_clip > 0`` (ONNX's ``clip`` bounds the
gates' pre-activations; TensorFlow's bounds the cell state: a different
function).
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import blockrnn

__all__ = ["export", "OPSET"]

# ONNX operator set of the exported models (LSTM-14 / GRU-14: the ``layout`` attribute).
OPSET = 14
# IR version 8 (ONNX 1.10+): every ONNX Runtime of the last years loads it.
_IR_VERSION = 8

_ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}


def _gates(w, order):
    """Split the last axis of w (..., 4H) into a dict gate -> (..., H) by ``order``."""
    return dict(zip(order.lower(), np.split(w, 4, axis=-1)))


def lstm_weights(w, b, wci=None, wcf=None, wco=None, *, gate_order="IFCO", forget_bias=0.0):
    """ONNX's LSTM ``W``, ``R``, ``B`` (and ``P`` when peepholes are given) from TensorFlow's.

    w (I+H, 4H) with gate columns ``gate_order`` ("IFCO": BlockLSTMV2, the
    layers; "ICFO": BlockLSTM / LSTMBlockCell); b (4H,); wci, wcf, wco (H,) or
    None; ``forget_bias`` is added to the forget gate's bias. Returns W (1, 4H, I),
    R (1, 4H, H), B (1, 8H) with Rb = 0, and P (1, 3H) or None, gates in ONNX's
    i, o, f, c order.
    """
    if gate_order not in ("IFCO", "ICFO"):
        raise ValueError(f"blockrnn.onnx.lstm_weights: gate_order must be 'IFCO' or 'ICFO', "
                         f"got {gate_order!r}")
    H = w.shape[1] // 4
    I = w.shape[0] - H
    gw, gb = _gates(w, gate_order), _gates(b, gate_order)
    gb["f"] = gb["f"] + np.asarray(forget_bias, b.dtype)
    W = np.concatenate([gw[g][:I].T for g in "iofc"])[None]
    R = np.concatenate([gw[g][I:].T for g in "iofc"])[None]
    B = np.concatenate([gb[g] for g in "iofc"] + [np.zeros(4 * H, b.dtype)])[None]
    P = None if wci is None else np.concatenate([wci, wco, wcf])[None]
    return W, R, B, P


def gru_weights(w_ru, w_c, b_ru, b_c):
    """ONNX's GRU ``W`` (1, 3H, I), ``R`` (1, 3H, H), ``B`` (1, 6H) from GRUBlockCell's weights.

    w_ru (I+H, 2H) columns [r | u]; w_c (I+H, H); b_ru (2H,); b_c (H,). ONNX's
    gates are z (= u), r, h (= c); Rb = 0 (with linear_before_reset=0 the
    candidate's Rbh and Wbh simply add).
    """
    H = w_c.shape[1]
    I = w_c.shape[0] - H
    r, u = w_ru[:, :H], w_ru[:, H:]
    W = np.concatenate([u[:I].T, r[:I].T, w_c[:I].T])[None]
    R = np.concatenate([u[I:].T, r[I:].T, w_c[I:].T])[None]
    B = np.concatenate([b_ru[H:], b_ru[:H], b_c, np.zeros(3 * H, b_c.dtype)])[None]
    return W, R, B


def _numpy_params(model):
    """(kind, params dict of NumPy arrays, input size, hidden size, cell_clip) of a model."""
    if isinstance(model, blockrnn.LSTM):
        return "LSTM", model.params, model.input_size, model.hidden_size, model.cell_clip
    if isinstance(model, blockrnn.GRU):
        return "GRU", model.params, model.input_size, model.hidden_size, 0.0
    bt = sys.modules.get("blockrnn.torch")   # a torch module exists only if this is imported
    if bt is not None and isinstance(model, (bt.LSTM, bt.GRU)):
        params = {k: v.detach().cpu().numpy() for k, v in model.named_parameters()}
        if isinstance(model, bt.LSTM):
            return "LSTM", params, model.input_size, model.hidden_size, model.cell_clip
        return "GRU", params, model.input_size, model.hidden_size, 0.0
    raise TypeError("blockrnn.onnx.export: model must be a blockrnn.LSTM, blockrnn.GRU, "
                    f"blockrnn.torch.LSTM or blockrnn.torch.GRU, got {type(model).__name__}")


def export(model, path=None, *, sequence_lens=False, initial_state=False):
    """The ONNX model (one ``LSTM`` / ``GRU`` node) computing ``model``'s forward.

    Parameters
    ----------
    model : blockrnn.LSTM, blockrnn.GRU, blockrnn.torch.LSTM or blockrnn.torch.GRU
        float32 or float64 (the graph's element type; ONNX Runtime 1.32's CPU
        LSTM and GRU run float32 only). An LSTM with
        ``cell_clip > 0`` is refused (ValueError): ONNX cannot express it.
    path : None, str or os.PathLike
        Where to write the model (``onnx.save``); None writes nothing.
    sequence_lens : bool, default False
        Add the graph input ``sequence_lens`` (B,) int32.
    initial_state : bool, default False
        Add the graph inputs ``initial_h`` (and ``initial_c`` for the LSTM), (1, B, H).

    Returns
    -------
    onnx.ModelProto, checked with ``onnx.checker.check_model(full_check=True)``.
    Outputs ``Y`` (T, 1, B, H), ``Y_h`` (and ``Y_c``) (1, B, H); see the module doc.
    """
    where = "blockrnn.onnx.export"
    kind, params, I, H, cell_clip = _numpy_params(model)
    if cell_clip > 0:
        raise ValueError(
            f"{where}: cell_clip={cell_clip} cannot be exported: ONNX's LSTM attribute "
            f"'clip' clips the gates' pre-activations, while TensorFlow's cell_clip clips "
            f"the cell state; the two compute different functions. Export a model with "
            f"cell_clip=0.")
    dtype = params["w_l0" if kind == "LSTM" else "w_c_l0"].dtype
    if dtype not in _ELEM:
        raise TypeError(f"{where}: parameters must be float32 or float64, got {dtype}")
    elem = _ELEM[dtype]
    if kind == "LSTM":
        peep = ([params[k] for k in ("wci_l0", "wcf_l0", "wco_l0")] if "wci_l0" in params
                else [None] * 3)
        W, R, B, P = lstm_weights(params["w_l0"], params["b_l0"], *peep)
    else:
        (W, R, B), P = gru_weights(params["w_ru_l0"], params["w_c_l0"], params["b_ru_l0"],
                                   params["b_c_l0"]), None
    consts = {"W": W, "R": R, "B": B}
    if P is not None:
        consts["P"] = P
    inits = [numpy_helper.from_array(np.ascontiguousarray(v, dtype), name)
             for name, v in consts.items()]

    state_names = ["initial_h", "initial_c"] if kind == "LSTM" else ["initial_h"]
    inputs = [helper.make_tensor_value_info("X", elem, ["T", "B", I])]
    if sequence_lens:
        inputs.append(helper.make_tensor_value_info("sequence_lens", TensorProto.INT32, ["B"]))
    if initial_state:
        inputs += [helper.make_tensor_value_info(n, elem, [1, "B", H]) for n in state_names]
    # The node's inputs by position; "" marks an absent optional input.
    node_inputs = ["X", "W", "R", "B", "sequence_lens" if sequence_lens else ""]
    node_inputs += state_names if initial_state else [""] * len(state_names)
    if P is not None:
        node_inputs.append("P")
    while node_inputs[-1] == "":
        node_inputs.pop()
    out_names = ["Y", "Y_h", "Y_c"] if kind == "LSTM" else ["Y", "Y_h"]
    outputs = [helper.make_tensor_value_info("Y", elem, ["T", 1, "B", H])]
    outputs += [helper.make_tensor_value_info(n, elem, [1, "B", H]) for n in out_names[1:]]
    attrs = {"hidden_size": H, "direction": "forward"}
    if kind == "GRU":
        attrs["linear_before_reset"] = 0
    node = helper.make_node(kind, node_inputs, out_names, name=kind.lower(), **attrs)
    graph = helper.make_graph([node], f"blockrnn_{kind.lower()}", inputs, outputs, inits)
    onnx_model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=_IR_VERSION,
        producer_name="blockrnn", producer_version=blockrnn.__version__)
    onnx.checker.check_model(onnx_model, full_check=True)
    if path is not None:
        onnx.save(onnx_model, os.fspath(path))
    return onnx_model

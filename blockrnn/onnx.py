"""ONNX export: a blockrnn LSTM or GRU as standard ONNX ``LSTM`` / ``GRU`` nodes.

Optional: needs the ``onnx`` package (``import blockrnn`` never imports it;
this module does). ``blockrnn.convert.from_onnx`` reads such models back.

``export(model, path=None, *, sequence_lens=False, initial_state=False)``
takes a ``blockrnn.LSTM`` / ``blockrnn.GRU`` (NumPy) or a
``blockrnn.torch.LSTM`` / ``blockrnn.torch.GRU`` and returns the
``onnx.ModelProto`` (also written to ``path`` when given). The graph has one
node per layer (``direction="forward"``, or ``"bidirectional"`` with both
directions' weights stacked on the first axis: ``W`` (2, G*H, I_k), ``R``
(2, G*H, H), ``B`` (2, 2*G*H), ``P`` (2, 3H)), time-major (ONNX ``layout=0``; a
``batch_first`` torch module is exported time-major too), with dynamic ``T``
and ``B``. ``L`` = num_layers, ``D`` = 2 if bidirectional else 1:

* inputs: ``X`` (T, B, I); with ``sequence_lens=True`` also ``sequence_lens``
  (B,) int32, fed to every node (ONNX Runtime wants every entry in [1, T]);
  with ``initial_state=True`` also ``initial_h`` (L*D, B, H) and, for the
  LSTM, ``initial_c`` (L*D, B, H) (``Split`` into (D, B, H) per node when
  L > 1). Left out, they are zeros / full length.
* outputs: ``Y`` (T, D, B, H), the last layer's (zero past a row's length);
  ``Y_h`` (L*D, B, H) and, for the LSTM, ``Y_c`` (L*D, B, H): the states after
  each row's last step (``Concat`` of the nodes' when L > 1), entry
  ``layer * D + direction`` as nn.LSTM's.
* between layers: ``Transpose`` of node k's Y (T, D, B, H) to (T, B, D, H) and
  ``Reshape`` to (T, B, D*H), node k+1's X (what PyTorch's exporter writes).

ONNX's reverse direction with ``sequence_lens`` reads each row's first
``sequence_lens[b]`` steps backwards, as blockrnn's does.

Layouts. ONNX's LSTM stacks its gates i, o, f, c (per direction ``W`` (4H, I),
``R`` (4H, H), ``B`` (8H,) = [Wb; Rb], peepholes ``P`` (3H,) = [p_i, p_o, p_f]);
TensorFlow's ``w`` (I+H, 4H) has gate columns IFCO (BlockLSTMV2, the layers)
or ICFO (BlockLSTM), and BlockLSTM adds ``forget_bias`` to the forget gate's
pre-activation, which goes into the forget gate's ``Wb``. ONNX's GRU stacks z,
r, h with ``h' = (1 - z) * h~ + z * h``: TensorFlow's update gate u is z, and
``linear_before_reset=0`` is GRUBlockCell's reset-before candidate
``c = tanh([x, r * h] @ w_c + b_c)`` (a ``GRU(reset_after=False)``);
``linear_before_reset=1`` is nn.GRU's reset-after candidate, a
``GRU(reset_after=True)`` (the default), whose weights are nn.GRU's (gates r,
z, n: reordered to z, r, h; ``B`` = [bias_ih; bias_hh], kept apart).

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


def gru_reset_after_weights(weight_ih, weight_hh, bias_ih, bias_hh):
    """ONNX's GRU ``W`` (1, 3H, I), ``R`` (1, 3H, H), ``B`` (1, 6H) from nn.GRU's weights,
    for a node with ``linear_before_reset=1``.

    weight_ih (3H, I), weight_hh (3H, H), bias_ih, bias_hh (3H,), gate blocks r,
    z, n (nn.GRU's); ONNX's are z, r, h, with B = [Wb; Rb] = [bias_ih; bias_hh]
    (Rb_h multiplies r with h's product: it stays apart from Wb_h).
    """
    H = weight_hh.shape[1]
    zrh = lambda a: np.concatenate([a[H:2 * H], a[:H], a[2 * H:]])  # noqa: E731
    return (zrh(weight_ih)[None], zrh(weight_hh)[None],
            np.concatenate([zrh(bias_ih), zrh(bias_hh)])[None])


def _numpy_layer(model):
    """The NumPy layer computing ``model``'s forward (a torch module's weights copied)."""
    if isinstance(model, (blockrnn.LSTM, blockrnn.GRU)):
        return model
    bt = sys.modules.get("blockrnn.torch")   # a torch module exists only if this is imported
    if bt is not None and isinstance(model, (bt.LSTM, bt.GRU)):
        return blockrnn.convert.from_torch(model)
    raise TypeError("blockrnn.onnx.export: model must be a blockrnn.LSTM, blockrnn.GRU, "
                    f"blockrnn.torch.LSTM or blockrnn.torch.GRU, got {type(model).__name__}")


def _layer_weights(layer, p, k):
    """ONNX's W, R, B (and P or None) of layer k, from the layer's checked params ``p``:
    directions stacked on axis 0 (forward, then reverse), as a bidirectional node wants
    them."""
    kind = type(layer).__name__
    per_direction = []
    for s in ("", "_reverse") if layer.bidirectional else ("",):
        if kind == "LSTM":
            peep = ([p[f"{n}_l{k}{s}"] for n in ("wci", "wcf", "wco")] if layer.use_peephole
                    else [None] * 3)
            per_direction.append(lstm_weights(p[f"w_l{k}{s}"], p[f"b_l{k}{s}"], *peep))
        elif layer.reset_after:
            per_direction.append(gru_reset_after_weights(*(p[f"{n}_l{k}{s}"] for n in (
                "weight_ih", "weight_hh", "bias_ih", "bias_hh"))) + (None,))
        else:
            per_direction.append(gru_weights(*(p[f"{n}_l{k}{s}"] for n in
                                               ("w_ru", "w_c", "b_ru", "b_c"))) + (None,))
    return [None if parts[0] is None else np.concatenate(parts) for parts in
            zip(*per_direction)]


def export(model, path=None, *, sequence_lens=False, initial_state=False):
    """The ONNX model computing ``model``'s forward: one ``LSTM`` / ``GRU`` node per layer.

    Parameters
    ----------
    model : blockrnn.LSTM, blockrnn.GRU, blockrnn.torch.LSTM or blockrnn.torch.GRU
        Any num_layers, bidirectional or not; float32 or float64 (the graph's
        element type; ONNX Runtime 1.32's CPU LSTM and GRU run float32 only). An
        LSTM with ``cell_clip > 0`` is refused (ValueError): ONNX cannot express
        it. A torch module's dropout is not exported (the graph is its ``eval()``
        forward).
    path : None, str or os.PathLike
        Where to write the model (``onnx.save``); None writes nothing.
    sequence_lens : bool, default False
        Add the graph input ``sequence_lens`` (B,) int32 (fed to every node).
    initial_state : bool, default False
        Add the graph inputs ``initial_h`` (and ``initial_c`` for the LSTM),
        (L*D, B, H).

    Returns
    -------
    onnx.ModelProto, checked with ``onnx.checker.check_model(full_check=True)``.
    Outputs ``Y`` (T, D, B, H) (the last layer's), ``Y_h`` (and ``Y_c``)
    (L*D, B, H); see the module doc.
    """
    where = "blockrnn.onnx.export"
    layer = _numpy_layer(model)
    kind = type(layer).__name__
    cell_clip = getattr(layer, "cell_clip", 0.0)
    if cell_clip > 0:
        raise ValueError(
            f"{where}: cell_clip={cell_clip} cannot be exported: ONNX's LSTM attribute "
            f"'clip' clips the gates' pre-activations, while TensorFlow's cell_clip clips "
            f"the cell state; the two compute different functions. Export a model with "
            f"cell_clip=0.")
    params = layer._checked_params(where)
    dtype = layer.dtype
    elem = _ELEM[dtype]
    I, H, L = layer.input_size, layer.hidden_size, layer.num_layers
    D = layer.num_directions
    states = ["h", "c"] if kind == "LSTM" else ["h"]

    inputs = [helper.make_tensor_value_info("X", elem, ["T", "B", I])]
    if sequence_lens:
        inputs.append(helper.make_tensor_value_info("sequence_lens", TensorProto.INT32, ["B"]))
    if initial_state:
        inputs += [helper.make_tensor_value_info(f"initial_{s}", elem, [L * D, "B", H])
                   for s in states]
    outputs = [helper.make_tensor_value_info("Y", elem, ["T", D, "B", H])]
    outputs += [helper.make_tensor_value_info(f"Y_{s}", elem, [L * D, "B", H])
                for s in states]

    def name(base, k):   # one layer: the graph's own names; L layers: per-layer names
        return base if L == 1 else f"{base}_l{k}"

    inits, nodes = [], []
    if initial_state and L > 1:     # (L*D, B, H) -> L pieces (D, B, H), one per node
        nodes += [helper.make_node("Split", [f"initial_{s}"],
                                   [f"initial_{s}_l{k}" for k in range(L)], axis=0,
                                   name=f"split_initial_{s}") for s in states]
    if L > 1:
        inits.append(numpy_helper.from_array(np.array([0, 0, -1], np.int64), "layer_shape"))
    x = "X"
    for k in range(L):
        W, R, B, P = _layer_weights(layer, params, k)
        consts = {"W": W, "R": R, "B": B, "P": P}
        inits += [numpy_helper.from_array(np.ascontiguousarray(v, dtype), name(n, k))
                  for n, v in consts.items() if v is not None]
        # the node's inputs by position; "" marks an absent optional input
        node_inputs = [x, name("W", k), name("R", k), name("B", k),
                       "sequence_lens" if sequence_lens else ""]
        node_inputs += ([name(f"initial_{s}", k) for s in states] if initial_state
                        else [""] * len(states))
        if P is not None:
            node_inputs.append(name("P", k))
        while node_inputs[-1] == "":
            node_inputs.pop()
        y = "Y" if k == L - 1 else f"Y_l{k}"
        attrs = {"hidden_size": H, "direction": "bidirectional" if D == 2 else "forward"}
        if kind == "GRU":
            attrs["linear_before_reset"] = int(layer.reset_after)
        nodes.append(helper.make_node(kind, node_inputs, [y] + [name(f"Y_{s}", k)
                                                                for s in states],
                                      name=name(kind.lower(), k), **attrs))
        if k < L - 1:   # Y (T, D, B, H) -> (T, B, D, H) -> the next layer's X (T, B, D*H)
            nodes.append(helper.make_node("Transpose", [y], [f"Y_l{k}_tbdh"],
                                          perm=[0, 2, 1, 3], name=f"transpose_l{k}"))
            x = f"X_l{k + 1}"
            nodes.append(helper.make_node("Reshape", [f"Y_l{k}_tbdh", "layer_shape"], [x],
                                          name=f"reshape_l{k}"))
    if L > 1:                       # the layers' final states, stacked as (L*D, B, H)
        nodes += [helper.make_node("Concat", [f"Y_{s}_l{k}" for k in range(L)], [f"Y_{s}"],
                                   axis=0, name=f"concat_Y_{s}") for s in states]
    graph = helper.make_graph(nodes, f"blockrnn_{kind.lower()}", inputs, outputs, inits)
    onnx_model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=_IR_VERSION,
        producer_name="blockrnn", producer_version=blockrnn.__version__)
    onnx.checker.check_model(onnx_model, full_check=True)
    if path is not None:
        onnx.save(onnx_model, os.fspath(path))
    return onnx_model

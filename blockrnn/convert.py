"""Weight import: Keras 3, PyTorch and ONNX recurrent layers -> blockrnn's NumPy layers.

* ``from_keras(layer)``: ``keras.layers.LSTM`` -> ``blockrnn.layers.LSTM``;
  ``keras.layers.GRU`` -> ``blockrnn.layers.GRU`` with the same ``reset_after``
  (Keras 3's default True is nn.GRU's math; False is GRUBlockCell's).
* ``from_torch(module)``: ``torch.nn.LSTM`` (stacked and bidirectional too; no
  projection) -> ``blockrnn.layers.LSTM``, ``torch.nn.GRU`` (any layers,
  direction, bias) -> ``blockrnn.layers.GRU`` (reset_after=True), with the
  same ``num_layers`` and ``bidirectional``; also ``blockrnn.torch.LSTM`` /
  ``GRU`` -> the NumPy layer with the same configuration and weights.
* ``from_onnx(model_or_path, node=None)``: an ONNX ``LSTM`` / ``GRU`` node
  (forward or bidirectional, default activations, no clip; a GRU with either
  ``linear_before_reset``) -> the layer; ``blockrnn.onnx.export`` writes such
  nodes.

Neither Keras, PyTorch nor ONNX is imported by this module; only the function given
such a layer touches its framework.

The two GRUs are different functions, not relayouts of each other: the
reset-after GRU (nn.GRU, Keras' reset_after=True, ONNX linear_before_reset=1)
applies the reset gate AFTER the recurrent matmul,
``n = tanh(x W + b + r * (h U + b_h))``, GRUBlockCell BEFORE it,
``c = tanh([x, r * h] @ w_c + b_c)``; each converts to the layer of its own
``reset_after``.
"""
import numpy as np

from blockrnn.layers import GRU, LSTM

__all__ = ["from_keras", "from_torch", "from_onnx"]

def _dtype(where, dtype, default):
    dt = np.dtype(default if dtype is None else dtype)
    if dt not in (np.float32, np.float64):
        raise TypeError(f"{where}: dtype must be float32 or float64, got {dt}")
    return dt


def _fill(layer, **arrays):
    """Copy ``arrays`` (every one of the layer's parameter names) into the layer. The
    converters check the source's shapes first; these checks catch a converter's bug
    (raised, not asserted: python -O would let a (1,) array broadcast into a (4H,) one)."""
    if set(arrays) != set(layer.params):
        raise AssertionError(f"_fill: {sorted(arrays)} are not {list(layer.params)}")
    for name, target in layer.params.items():
        value = np.asarray(arrays[name], dtype=layer.dtype)
        if value.shape != target.shape:
            raise AssertionError(f"_fill: {name} has shape {value.shape}, not {target.shape}")
        target[...] = value
    return layer


# --------------------------------------------------------------------------
# Keras 3
# --------------------------------------------------------------------------

def _activation_name(fn):
    return getattr(fn, "__name__", None) or type(fn).__name__


def _keras_numpy(variable):
    return np.array(variable.numpy())


def from_keras(layer, *, dtype=None):
    """A ``blockrnn.layers.LSTM`` / ``GRU`` with the weights of a Keras 3 layer.

    Parameters
    ----------
    layer : keras.layers.LSTM or keras.layers.GRU (built: called once or
        ``build()``-ed). Needs activation ``tanh``, recurrent_activation
        ``sigmoid`` and ``go_backwards=False``. Dropout settings are ignored
        (inference).
    dtype : None (the layer's weight dtype) or float32 / float64

    Keras LSTM: ``kernel`` (I, 4H) and ``recurrent_kernel`` (H, 4H) have gate
    columns i, f, c, o = IFCO, so ``w = [kernel; recurrent_kernel]`` and
    ``b = bias`` (Keras' unit_forget_bias only initialises the bias).
    Keras GRU: columns z (update), r (reset), h (candidate),
    ``h' = z * h + (1 - z) * hh``. reset_after=True (bias (2, 3H) = [input
    bias; recurrent bias]) is nn.GRU's math with z its update gate:
    ``weight_ih_l0 = [W_r; W_z; W_h]^T`` (3H, I), ``weight_hh_l0 = [U_r; U_z;
    U_h]^T``, ``bias_ih_l0``, ``bias_hh_l0`` the two bias rows in r, z, h order.
    reset_after=False (bias (3H,)) is GRUBlockCell's ``h' = u * h + (1 - u) * c``
    with u = z: ``w_ru = [[W_r, W_z], [U_r, U_z]]``, ``w_c = [W_h; U_h]``,
    ``b_ru = [b_r, b_z]``, ``b_c = b_h``.

    Keras is batch-major: ``keras_layer(x)`` equals ``blockrnn_layer.forward(
    x.transpose(1, 0, 2))[0].transpose(1, 0, 2)``.
    """
    import keras
    where = "blockrnn.convert.from_keras"
    if isinstance(layer, keras.layers.LSTM):
        kind = "LSTM"
    elif isinstance(layer, keras.layers.GRU):
        kind = "GRU"
    else:
        raise TypeError(f"{where}: expected a keras.layers.LSTM or keras.layers.GRU, got "
                        f"{type(layer).__name__}")
    cell = layer.cell
    if not layer.built or getattr(cell, "kernel", None) is None:
        raise ValueError(f"{where}: the Keras {kind} has no weights yet; call it on an "
                         f"input (or build it) first")
    if _activation_name(cell.activation) != "tanh":
        raise ValueError(f"{where}: only activation='tanh' is supported (blockrnn's "
                         f"{kind} uses tanh), got {_activation_name(cell.activation)!r}")
    if _activation_name(cell.recurrent_activation) != "sigmoid":
        raise ValueError(f"{where}: only recurrent_activation='sigmoid' is supported, got "
                         f"{_activation_name(cell.recurrent_activation)!r}")
    if layer.go_backwards:
        raise ValueError(f"{where}: go_backwards=True is not supported; reverse the "
                         f"sequence yourself and convert a forward layer")
    kernel = _keras_numpy(cell.kernel)
    recurrent = _keras_numpy(cell.recurrent_kernel)
    I, H = kernel.shape[0], cell.units
    dt = _dtype(where, dtype, kernel.dtype)
    n_gates = 4 if kind == "LSTM" else 3
    reset_after = kind == "GRU" and bool(cell.reset_after)
    bias_shape = (2, n_gates * H) if reset_after else (n_gates * H,)
    bias = (_keras_numpy(cell.bias) if cell.use_bias and cell.bias is not None
            else np.zeros(bias_shape, kernel.dtype))
    w = np.concatenate([kernel, recurrent], axis=0)          # (I+H, n_gates*H)
    if kind == "LSTM":
        return _fill(LSTM(I, H, dtype=dt), w_l0=w, b_l0=bias)
    z, r, h = (slice(k * H, (k + 1) * H) for k in range(3))
    if reset_after:   # Keras' z, r, h -> nn.GRU's r, z, n
        rzh = lambda a: np.concatenate([a[..., r], a[..., z], a[..., h]], axis=-1)  # noqa: E731
        return _fill(GRU(I, H, reset_after=True, dtype=dt),
                     weight_ih_l0=rzh(kernel).T, weight_hh_l0=rzh(recurrent).T,
                     bias_ih_l0=rzh(bias[0]), bias_hh_l0=rzh(bias[1]))
    return _fill(GRU(I, H, reset_after=False, dtype=dt),
                 w_ru_l0=np.concatenate([w[:, r], w[:, z]], axis=1), w_c_l0=w[:, h],
                 b_ru_l0=np.concatenate([bias[r], bias[z]]), b_c_l0=bias[h])


# --------------------------------------------------------------------------
# PyTorch
# --------------------------------------------------------------------------

def from_torch(module, *, dtype=None):
    """A ``blockrnn.layers.LSTM`` / ``GRU`` with the weights of a PyTorch module.

    Parameters
    ----------
    module : torch.nn.LSTM (any num_layers, bidirectional or not, bias on or off;
        proj_size=0), torch.nn.GRU (the same), or a ``blockrnn.torch.LSTM`` /
        ``blockrnn.torch.GRU``.
    dtype : None (the module's dtype; float32 for a bfloat16 / float16 module, whose
        values float32 holds exactly) or float32 / float64

    The NumPy layer gets the module's ``num_layers`` and ``bidirectional`` (and a
    blockrnn module's ``use_peephole`` and ``cell_clip``). From an nn.LSTM or a
    blockrnn.torch.LSTM (nn.LSTM's parameters): gate order (i, f, g, o) is IFCO,
    ``w_l{k}{s} = [W_ih_l{k}{s}.T; W_hh_l{k}{s}.T]`` (I_k+H, 4H) and
    ``b_l{k}{s} = b_ih + b_hh`` (zeros without bias; plus a blockrnn module's
    ``forget_bias`` on the f block), peepholes ``weight_ci/cf/co_l{k}{s}`` ->
    ``wci/wcf/wco_l{k}{s}``. From an nn.GRU or a blockrnn.torch.GRU: a
    ``blockrnn.layers.GRU`` of the same ``reset_after`` (nn.GRU: True), whose
    parameters are the module's own, names and layouts (zero biases without
    bias). States are (num_layers * num_directions, B, H) on both sides.
    The NumPy layer is time-major: ``batch_first`` is a property of the torch
    module only, so with ``batch_first=True`` transpose the input's first two
    axes yourself. Dropout is a training-time setting and is not carried over
    (the layer computes the module's ``eval()`` forward).
    """
    import torch
    where = "blockrnn.convert.from_torch"
    from blockrnn import torch as bt   # convert -> torch, never the other way
    if isinstance(module, bt.GRU):      # the layer of the same reset_after, the same names
        params = _torch_params(where, module)
        dt = _dtype(where, dtype, next(iter(params.values())).dtype)
        out = GRU(module.input_size, module.hidden_size, module.num_layers,
                  bidirectional=module.bidirectional, reset_after=module.reset_after, dtype=dt)
        # bias=False: the module has no bias parameters; the layer's are zero
        zeros = {k: np.zeros_like(v) for k, v in out.params.items() if k not in params}
        return _fill(out, **params, **zeros)
    if isinstance(module, bt.LSTM):
        # nn.LSTM's parameters -> w_l{k} = [W_ih.T; W_hh.T], b_l{k} = b_ih + b_hh
        # (+ forget_bias on the f block), peepholes wci/wcf/wco_l{k}
        a = bt.nn_lstm_arrays(module, where)
        dt = _dtype(where, dtype, a["params"]["w_l0"].dtype)
        out = LSTM(module.input_size, module.hidden_size, module.num_layers,
                   bidirectional=module.bidirectional, use_peephole=module.use_peephole,
                   cell_clip=module.cell_clip, dtype=dt)
        return _fill(out, **a["params"])
    if isinstance(module, torch.nn.GRU):
        return _from_nn_gru(module, dtype, where)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"{where}: expected a torch.nn.LSTM or torch.nn.GRU, got "
                        f"{type(module).__name__}")
    a = bt.nn_lstm_arrays(module, where)
    dt = _dtype(where, dtype, a["params"]["w_l0"].dtype)
    out = LSTM(a["input_size"], a["hidden_size"], a["num_layers"],
               bidirectional=a["bidirectional"], dtype=dt)
    return _fill(out, **a["params"])


def _torch_params(where, module):
    """A GRU module's weights as NumPy arrays by name (bt.param_array), read as its
    forward reads them: by attribute, so that a parametrized weight (weight_norm) is
    its computed value (named_parameters would give the parametrization's originals)."""
    import torch
    from blockrnn import torch as bt
    bt._check_source(where, module, (torch.nn.GRU, bt.GRU), "GRU module", bt._MODULE_DTYPES)
    return {n: bt.param_array(getattr(module, n)) for n in module._flat_weights_names}


def _from_nn_gru(module, dtype, where):
    """torch.nn.GRU -> blockrnn.layers.GRU(reset_after=True): the same parameter names
    and layouts (zero biases for bias=False)."""
    params = _torch_params(where, module)
    dt = _dtype(where, dtype, next(iter(params.values())).dtype)
    out = GRU(module.input_size, module.hidden_size, module.num_layers,
              bidirectional=module.bidirectional, reset_after=True, dtype=dt)
    zeros = {k: np.zeros_like(v) for k, v in out.params.items() if k not in params}
    return _fill(out, **params, **zeros)


# --------------------------------------------------------------------------
# ONNX
# --------------------------------------------------------------------------

# Attribute values that match blockrnn's math (absent attributes take ONNX's defaults).
_ONNX_DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}


# Ops whose result _onnx_tensors computes when every input is constant: the shape and
# weight arithmetic exporters write (torch's dynamo exporter with optimize=False slices
# and concatenates the weights; shapes are Concat of Shape slices).
_ONNX_FOLDABLE = ("Identity", "Cast", "Concat", "Transpose", "Unsqueeze", "Squeeze",
                  "Reshape", "Shape", "Expand", "Add", "Sub", "Mul", "Gather", "Slice", "Split")
# Ops that only move a tensor's elements: node k+1's X is node k's Y through these.
_ONNX_LAYOUT_OPS = ("Identity", "Transpose", "Reshape", "Squeeze", "Unsqueeze")


def _onnx_tensors(graph):
    """name -> NumPy array of the graph's initializers, Constant nodes' values, and the
    outputs of _ONNX_FOLDABLE nodes whose inputs are all such constants (nodes are
    topologically sorted, as ONNX requires), or of Shape nodes reading dims the graph
    declares fixed (torch's exporter with optimize=False slices the weights by
    ``Shape(h0)[2]`` = H)."""
    from onnx import helper, numpy_helper
    out = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    declared = {v.name: [d.dim_value if d.HasField("dim_value") else None
                         for d in v.type.tensor_type.shape.dim]
                for v in list(graph.input) + list(graph.value_info)
                if v.type.tensor_type.HasField("shape")}
    for n in graph.node:
        if n.op_type == "Constant" and len(n.attribute) == 1:
            a = n.attribute[0]
            if a.name == "value":
                out[n.output[0]] = numpy_helper.to_array(helper.get_attribute_value(a))
            elif a.name in ("value_float", "value_floats"):
                out[n.output[0]] = np.array(helper.get_attribute_value(a), np.float32)
            elif a.name in ("value_int", "value_ints"):
                out[n.output[0]] = np.array(helper.get_attribute_value(a), np.int64)
        elif n.op_type == "Shape" and n.input[0] not in out and n.input[0] in declared:
            attrs, dims = _onnx_attrs(n), declared[n.input[0]]
            dims = dims[attrs.get("start", 0):attrs.get("end", len(dims))]
            if None not in dims:
                out[n.output[0]] = np.array(dims, np.int64)
        elif (n.op_type in _ONNX_FOLDABLE and n.input and n.input[0] in out
                and all(i == "" or i in out for i in n.input)):
            try:
                values = _onnx_fold(n, [out[i] if i else None for i in n.input])
            except (ValueError, TypeError, IndexError, KeyError):
                values = None                    # an unusual use: the value stays unknown
            if values is not None and len(values) == len(n.output):
                out.update(zip(n.output, values))
    return out


def _onnx_fold(n, args):
    """Node n's outputs (n one of _ONNX_FOLDABLE) from its constant inputs ``args``
    (None for an absent optional input), or None for a use this evaluator does not cover."""
    op, attrs = n.op_type, _onnx_attrs(n)
    x = args[0]

    def ints(pos, attr):
        a = args[pos] if len(args) > pos and args[pos] is not None else attrs.get(attr)
        return None if a is None else [int(v) for v in np.ravel(a)]

    if op == "Identity":
        return [x]
    if op == "Cast":
        import onnx
        return [x.astype(onnx.helper.tensor_dtype_to_np_dtype(attrs["to"]))]
    if op == "Concat":
        return [np.concatenate(args, axis=attrs["axis"])]
    if op == "Transpose":
        return [np.transpose(x, attrs.get("perm"))]
    if op == "Unsqueeze":
        axes = ints(1, "axes")
        return [np.expand_dims(x, tuple(a % (x.ndim + len(axes)) for a in axes))]
    if op == "Squeeze":
        axes = ints(1, "axes")
        return [np.squeeze(x, None if axes is None else tuple(axes))]
    if op == "Reshape":
        shape = ints(1, "shape")
        if not attrs.get("allowzero", 0):                    # 0 copies the input's dim
            shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
        return [np.reshape(x, shape)]
    if op == "Shape":
        return [np.array(x.shape[attrs.get("start", 0):attrs.get("end", x.ndim)], np.int64)]
    if op == "Expand":
        shape = np.broadcast_shapes(x.shape, tuple(ints(1, "shape")))
        if np.prod(shape) > 1 << 24:
            return None                      # not the weights' arithmetic: left unknown
        return [np.broadcast_to(x, shape).copy()]
    if op in ("Add", "Sub", "Mul"):
        return [{"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}[op](x, args[1])]
    if op == "Gather":
        return [np.take(x, args[1], axis=attrs.get("axis", 0))]
    if op == "Slice":
        starts, ends = ints(1, "starts"), ints(2, "ends")
        axes = ints(3, "axes") or list(range(len(starts)))
        steps = ints(4, "steps") or [1] * len(starts)
        index = [slice(None)] * x.ndim
        for s, e, a, st in zip(starts, ends, axes, steps):
            index[a] = slice(s, e, st)                       # ONNX clamps as Python does
        return [x[tuple(index)]]
    if op == "Split":
        axis, sizes = attrs.get("axis", 0), ints(1, "split")
        if sizes is None:
            if x.shape[axis] % len(n.output):
                return None                  # opset 18's uneven split: not NumPy's rule
            return np.split(x, len(n.output), axis=axis)
        return np.split(x, np.cumsum(sizes)[:-1], axis=axis)
    return None


def _onnx_attrs(n):
    import onnx
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
    for key, value in attrs.items():
        if isinstance(value, bytes):
            attrs[key] = value.decode()
        elif isinstance(value, list):
            attrs[key] = [v.decode() if isinstance(v, bytes) else v for v in value]
    return attrs


def _onnx_static_dims(model):
    """name -> tuple of dims (an int, or None when not fixed) of every tensor ONNX's shape
    inference (or the model's own value_info) gives a shape."""
    import onnx
    try:
        graph = onnx.shape_inference.infer_shapes(model).graph
    except Exception:                        # noqa: BLE001 (e.g. a model over 2 GB)
        graph = model.graph
    return {v.name: tuple(d.dim_value if d.HasField("dim_value") else None
                          for d in v.type.tensor_type.shape.dim)
            for v in list(graph.value_info) + list(graph.input) + list(graph.output)
            if v.type.tensor_type.HasField("shape")}


class _Refused(Exception):
    """A chain link that is not (T, B, D*H) from node k's Y."""


def _onnx_link_layout(y, path, sizes, consts, producer):
    """The dims of the tensor that the layout ops ``path`` (in graph order) make of an
    LSTM/GRU node's ``Y`` (T, D, B, H), each dim the tuple of the axes it holds,
    major to minor; axes of size 1 that are not T or B hold no place and are left out.
    ``sizes`` maps "T", "D", "B", "H" to the size (None when not fixed). The Reshape
    targets are evaluated symbolically (constants, Shape of a tensor of the path,
    Slice/Gather/Concat/Mul/...), so a shape computed at run time is followed as well
    as a constant one. Raises _Refused(op_type) at an op it cannot follow."""
    def sym(a):                              # sizes Shape reports as unknowns
        return a in "TB" or sizes[a] is None

    def item(group):                         # one dim's size as (known factor, unknowns)
        return (int(np.prod([sizes[a] for a in group if not sym(a)])),
                tuple(sorted(a for a in group if sym(a))))

    dims = {y: [(a,) if a in "TB" or sizes[a] != 1 else () for a in "TDBH"]}

    def value(name):
        """A 1-d int tensor as a list of (known factor, unknowns) items."""
        if name in consts:
            return [(int(v), ()) for v in np.ravel(consts[name])]
        n = producer.get(name)
        op = n.op_type if n is not None else None
        attrs = _onnx_attrs(n) if n is not None else {}
        if op == "Shape" and n.input[0] in dims:
            d = dims[n.input[0]]
            return [item(g) for g in d[attrs.get("start", 0):attrs.get("end", len(d))]]
        if op in ("Identity", "Cast", "Squeeze", "Unsqueeze", "Reshape"):
            return value(n.input[0])         # a 1-d (or scalar) value keeps its items
        if op == "Concat":
            return [v for i in n.input for v in value(i)]
        if op == "Mul":
            a, b = value(n.input[0]), value(n.input[1])
            if len(a) != 1 or len(b) != 1:
                raise _Refused(op)
            return [(a[0][0] * b[0][0], tuple(sorted(a[0][1] + b[0][1])))]
        if op == "Gather" and n.input[1] in consts:
            v, index = value(n.input[0]), [int(i) for i in np.ravel(consts[n.input[1]])]
            if any(not -len(v) <= i < len(v) for i in index):
                raise _Refused(op)
            return [v[i] for i in index]
        if op == "Slice" and len(n.input) > 2 and all(i in consts for i in n.input[1:] if i):
            v = value(n.input[0])
            c = [consts[i].ravel() if i else None for i in n.input[1:]] + [None] * 3
            if c[2] is not None and list(c[2]) not in ([0], [-1]):
                raise _Refused(op)
            return v[int(c[0][0]):int(c[1][0]):1 if c[3] is None else int(c[3][0])]
        raise _Refused(op or "graph input")

    def take(axes, target):
        """How many of ``axes`` (from the front) make one dim of size ``target``."""
        k, unknowns = target
        for count in list(range(1, len(axes) + 1)) + [0]:
            run = axes[:count]
            if item(run) == target:
                return count
            known = [sizes[a] for a in run]
            if not unknowns and None not in known and int(np.prod(known)) == k:
                return count
        return None

    def reshape(d, shape, allowzero):
        axes = [a for g in d for a in g]     # the elements' order, major to minor
        if (0, ()) in shape[len(d):] and not allowzero:
            raise _Refused("Reshape")        # a 0 copying a dim the input lacks
        shape = [item(d[i]) if s == (0, ()) and not allowzero else s
                 for i, s in enumerate(shape)]
        if shape.count((-1, ())) > 1 or any(s[0] < 0 and s != (-1, ()) for s in shape):
            raise _Refused("Reshape")
        wild = shape.index((-1, ())) if (-1, ()) in shape else len(shape)
        front, back = [], []
        for s in shape[:wild]:
            count = take(axes, s)
            if count is None:
                raise _Refused("Reshape")
            front.append(tuple(axes[:count]))
            axes = axes[count:]
        for s in reversed(shape[wild + 1:]):
            count = take(axes[::-1], s)
            if count is None:
                raise _Refused("Reshape")
            back.insert(0, tuple(axes[len(axes) - count:]))
            axes = axes[:len(axes) - count]
        if wild == len(shape) and axes:
            raise _Refused("Reshape")
        return front + ([tuple(axes)] if wild < len(shape) else []) + back

    for n in path:
        d, attrs, op = dims[n.input[0]], _onnx_attrs(n), n.op_type
        if op == "Identity":
            new = d
        elif op == "Transpose":
            perm = list(attrs.get("perm", range(len(d))[::-1]))
            if sorted(perm) != list(range(len(d))):
                raise _Refused(op)
            new = [d[i] for i in perm]
        elif op in ("Squeeze", "Unsqueeze"):
            axes = attrs.get("axes", [int(v) for v in np.ravel(consts.get(
                n.input[1] if len(n.input) > 1 else "", []))])
            rank = len(d) + (len(axes) if op == "Unsqueeze" else 0)
            if any(not -rank <= a < rank for a in axes):
                raise _Refused(op)
            axes = sorted({a % rank for a in axes})
            if op == "Squeeze" and (not axes or any(d[a] for a in axes)):
                raise _Refused(op)           # only dims of size 1 (held no axis) go
            new = [g for i, g in enumerate(d) if i not in axes] if op == "Squeeze" else d[:]
            for a in axes if op == "Unsqueeze" else ():
                new.insert(a, ())
        else:
            new = reshape(d, value(n.input[1]), attrs.get("allowzero", 0))
        dims[n.output[0]] = new
    return dims[path[-1].output[0]] if path else dims[y]


def _onnx_chain(model, rnns, consts, where):
    """The LSTM/GRU nodes of a stacked model in layer order: node k+1's X is node k's Y
    (T, D, B, H) as (T, B, D*H), through any Identity/Transpose/Reshape/Squeeze/Unsqueeze
    nodes that compute exactly that (blockrnn.onnx.export and torch's dynamo exporter
    write Transpose(perm [0, 2, 1, 3]) then Reshape; torch's TorchScript exporter, with one
    direction, Squeeze of axis 1). Anything else is refused with a ValueError."""
    graph = model.graph
    producer = {out: n for n in graph.node for out in n.output}
    names = [n.name for n in rnns]
    rnn_ids = {id(n) for n in rnns}
    static = None                            # the tensors' fixed dims, inferred when needed

    def refuse(why):
        raise ValueError(f"{where}: the model has {len(rnns)} LSTM/GRU nodes ({names}) "
                         f"that are not one stacked layer ({why}); pass node=<name> to "
                         f"pick one")

    def after_rnn(name):
        """Whether tensor ``name`` is computed from an LSTM/GRU node's output."""
        todo, seen = [name], set()
        while todo:
            n = producer.get(todo.pop())
            if n is not None and id(n) not in seen:
                if id(n) in rnn_ids:
                    return True
                seen.add(id(n))
                todo.extend(i for i in n.input if i)
        return False

    def feeding(n):
        """The LSTM/GRU node whose Y becomes n's X, or None when X is not computed from one."""
        nonlocal static
        path, x = [], n.input[0]
        while producer.get(x) is not None and producer[x].op_type in _ONNX_LAYOUT_OPS:
            path.insert(0, producer[x])
            x = producer[x].input[0]
        prev = producer.get(x)
        if id(prev) not in rnn_ids:
            if after_rnn(x):
                refuse(f"node {n.name!r}'s X comes from a {prev.op_type} node")
            return None
        if prev.output[0] != x:
            refuse(f"node {n.name!r}'s X is not another LSTM/GRU node's Y")
        attrs = _onnx_attrs(prev)
        R = consts.get(prev.input[2]) if len(prev.input) > 2 else None
        static = _onnx_static_dims(model) if static is None else static
        y_dims = static.get(x, ())                                  # (T, D, B, H)
        T, B = (y_dims[0], y_dims[2]) if len(y_dims) == 4 else (None, None)
        sizes = {"T": T, "B": B, "D": 2 if attrs.get("direction") == "bidirectional" else 1,
                 "H": attrs.get("hidden_size", None if R is None else R.shape[-1])}
        want = [("T",), ("B",), tuple(a for a in "DH" if sizes[a] != 1)]
        if not path:
            refuse(f"node {n.name!r}'s X is node {prev.name!r}'s Y (T, D, B, H) itself, "
                   f"not (T, B, D*H)")
        try:
            if _onnx_link_layout(x, path, sizes, consts, producer) == want:
                return prev
            what = path[-1].op_type
        except _Refused as e:
            what = e.args[0]
        refuse(f"node {n.name!r}'s X comes from an unexpected {what}")

    nexts = {}
    firsts = []
    for n in rnns:
        prev = feeding(n)
        if prev is None:
            firsts.append(n)
        elif prev.name in nexts:
            refuse(f"node {prev.name!r} feeds two nodes")
        else:
            nexts[prev.name] = n
    if len(firsts) != 1:
        refuse(f"{len(firsts)} of them read the graph's input")
    chain = firsts
    while chain[-1].name in nexts:
        chain.append(nexts[chain[-1].name])
    if len(chain) != len(rnns):
        refuse("they do not form one chain")
    return chain


def _onnx_node_arrays(n, consts, where):
    """One ONNX LSTM/GRU node's weights in blockrnn's layout, after checking that the
    node computes what blockrnn computes. Returns (kind, I, H, directions) with
    directions a list (forward[, reverse]) of dicts of TensorFlow-layout arrays
    (LSTM ``w``, ``b``, optionally ``wci``, ``wcf``, ``wco``; GRU ``w_ru``, ``w_c``,
    ``b_ru``, ``b_c``)."""
    kind = n.op_type
    attrs = _onnx_attrs(n)

    def refuse(name, why):
        raise ValueError(f"{where}: {kind} node {n.name!r} has {name}={attrs[name]!r}; {why}")

    direction = attrs.get("direction", "forward")
    if direction not in ("forward", "bidirectional"):
        refuse("direction", "only direction='forward' or 'bidirectional' converts (blockrnn's "
                            "layers have no reverse-only direction)")
    D = 2 if direction == "bidirectional" else 1
    if "activations" in attrs and attrs["activations"] != _ONNX_DEFAULT_ACTIVATIONS[kind] * D:
        refuse("activations", f"blockrnn's {kind} uses {_ONNX_DEFAULT_ACTIVATIONS[kind]} "
                              f"in every direction")
    for name in ("activation_alpha", "activation_beta"):
        if attrs.get(name):
            refuse(name, "blockrnn's activations take no parameters")
    if "clip" in attrs:
        refuse("clip", "ONNX's clip bounds the gates' pre-activations, which blockrnn "
                       "does not do (its cell_clip bounds the cell state)")
    if attrs.get("input_forget", 0) != 0:
        refuse("input_forget", "coupled input and forget gates are not blockrnn's LSTM")
    if attrs.get("layout", 0) != 0:
        refuse("layout", "blockrnn's layers are time-major (layout=0)")
    if kind == "GRU" and attrs.get("linear_before_reset", 0) not in (0, 1):
        refuse("linear_before_reset", "ONNX defines 0 (GRUBlockCell's reset-before GRU) "
                                      "and 1 (nn.GRU's reset-after GRU) only")
    names = list(n.input) + [""] * 8
    arrays = {}
    for pos, key in ((1, "W"), (2, "R"), (3, "B"), (7, "P")):
        name = names[pos]
        if name == "":
            continue
        if name not in consts:
            raise ValueError(f"{where}: {kind} node {n.name!r}: input {key} ({name!r}) is not "
                             f"a constant of the graph (initializer or Constant node)")
        arrays[key] = consts[name]
    if "W" not in arrays or "R" not in arrays:
        raise ValueError(f"{where}: {kind} node {n.name!r} lacks its W or R input")
    G = 4 if kind == "LSTM" else 3
    Ws, Rs = arrays["W"], arrays["R"]                    # (D, G*H, I), (D, G*H, H)
    H = Rs.shape[-1] if Rs.ndim == 3 else None
    if (attrs.get("hidden_size", H) != H or Ws.ndim != 3 or Rs.ndim != 3
            or Ws.shape[:2] != (D, G * H) or Rs.shape[:2] != (D, G * H)):
        raise ValueError(f"{where}: {kind} node {n.name!r}: W {Ws.shape} and R {Rs.shape} "
                         f"do not fit hidden_size={attrs.get('hidden_size')} and "
                         f"direction={direction!r}")
    I = Ws.shape[2]
    shapes = {"B": (D, 2 * G * H), "P": (D, 3 * H)}   # W's and R's define D, H and I
    for key, a in arrays.items():
        if a.dtype not in (np.float16, np.float32, np.float64) or a.dtype != Ws.dtype:
            raise ValueError(f"{where}: {kind} node {n.name!r}: input {key} has element type "
                             f"{a.dtype}; W, R, B and P must share one of float16, float32, "
                             f"float64 (W has {Ws.dtype})")
        if key in shapes and a.shape != shapes[key]:
            raise ValueError(f"{where}: {kind} node {n.name!r}: input {key} must have shape "
                             f"{shapes[key]} (hidden_size={H}, input size {I}, {D} "
                             f"direction(s)), got {a.shape}")
    Bs = arrays.get("B", np.zeros((D, 2 * G * H), Ws.dtype))
    blocks = {g: slice(k * H, (k + 1) * H) for k, g in
              enumerate("iofc" if kind == "LSTM" else "zrh")}
    directions = []
    for d in range(D):
        bias = Bs[d][:G * H] + Bs[d][G * H:]                 # Wb + Rb
        wt = np.concatenate([Ws[d].T, Rs[d].T], axis=0)      # (I+H, G*H), ONNX gate order
        if kind == "LSTM":
            out = {"w": np.concatenate([wt[:, blocks[g]] for g in "ifco"], axis=1),
                   "b": np.concatenate([bias[blocks[g]] for g in "ifco"])}
            if "P" in arrays:
                p_i, p_o, p_f = np.split(arrays["P"][d], 3)
                out.update(wci=p_i, wcf=p_f, wco=p_o)
        elif attrs.get("linear_before_reset", 0):   # nn.GRU's layout, gates r, z, n
            rzh = lambda a: np.concatenate([a[blocks[g]] for g in "rzh"])  # noqa: E731
            out = {"weight_ih": rzh(Ws[d]), "weight_hh": rzh(Rs[d]),
                   "bias_ih": rzh(Bs[d][:G * H]), "bias_hh": rzh(Bs[d][G * H:])}
        else:
            out = {"w_ru": np.concatenate([wt[:, blocks["r"]], wt[:, blocks["z"]]], axis=1),
                   "w_c": wt[:, blocks["h"]],
                   "b_ru": np.concatenate([bias[blocks["r"]], bias[blocks["z"]]]),
                   "b_c": bias[blocks["h"]]}
        directions.append(out)
    return kind, I, H, directions


def from_onnx(model_or_path, node=None, *, dtype=None):
    """The ``blockrnn.LSTM`` / ``GRU`` whose forward equals an ONNX model's LSTM / GRU.

    Parameters
    ----------
    model_or_path : onnx.ModelProto, or a path (str / os.PathLike) to one
    node : None, or a node name (str): convert that one ``LSTM`` / ``GRU`` node
        (a one-layer layer)
    dtype : None (the weights' dtype) or float32 / float64

    With ``node=None`` the model holds either one ``LSTM`` / ``GRU`` node, or a
    chain of them joined as ``blockrnn.onnx.export`` and PyTorch's exporters
    write stacked layers: node k+1 reads node k's ``Y`` (T, D, B, H) as
    (T, B, D*H), through ``Transpose(perm=[0, 2, 1, 3])`` and ``Reshape`` (or,
    with one direction, ``Squeeze`` of axis 1), or any Identity / Transpose /
    Reshape / Squeeze / Unsqueeze nodes that compute the same (Reshape targets
    constant or computed from ``Shape``, as torch's dynamo exporter writes them
    for dynamic T and B); the chain becomes one layer with ``num_layers`` = its
    length. A node with ``direction="bidirectional"`` gives
    ``bidirectional=True`` (ONNX's reverse direction, like blockrnn's, reads
    each row's first ``sequence_lens[b]`` steps backwards). Weights computed
    from constants (Slice / Concat / Unsqueeze / ... of initializers, as torch's
    exporter with ``optimize=False`` writes them) count as constants.

    Every node must be what blockrnn computes: ``direction`` "forward" or
    "bidirectional" (the same in every node), default activations, no ``clip``,
    ``input_forget=0``, ``layout=0``, a GRU's ``linear_before_reset`` the same
    in every node (1: ``GRU(reset_after=True)``, 0: ``reset_after=False``), and
    its ``W``, ``R``, ``B``, ``P`` constant (initializers or Constant nodes).
    Anything else is refused with a ValueError naming the attribute. ONNX's
    gate orders (LSTM i, o, f, c; GRU z, r, h) map to TensorFlow's (IFCO;
    [r | u], c with u = z) and the biases become ``b = Wb + Rb``, or, for
    ``linear_before_reset=1``, to nn.GRU's r, z, n with ``bias_ih = Wb``,
    ``bias_hh = Rb`` (kept apart: Rb_h sits inside r's product); ``P`` = [p_i,
    p_o, p_f] becomes the peepholes (zeros for a node of the chain without
    ``P``). The layer is time-major like the nodes: ``Y`` of the last node,
    transposed to (T, B, D, H) and reshaped to (T, B, D*H), is ``forward(X)[0]``.
    To serve the model (no backward follows), call ``.inference()`` on the layer:
    a frozen copy with its weights packed once (README, Inference).
    """
    import os

    import onnx
    where = "blockrnn.convert.from_onnx"
    if isinstance(model_or_path, (str, os.PathLike)):
        model = onnx.load(os.fspath(model_or_path))
    elif isinstance(model_or_path, onnx.ModelProto):
        model = model_or_path
    else:
        raise TypeError(f"{where}: expected an onnx.ModelProto or a path, got "
                        f"{type(model_or_path).__name__}")
    rnns = [n for n in model.graph.node if n.op_type in ("LSTM", "GRU")]
    consts = _onnx_tensors(model.graph)
    if node is not None:
        chain = [r for r in rnns if r.name == node][:1]
        if not chain:
            raise ValueError(f"{where}: no LSTM/GRU node named {node!r}; the model has "
                             f"{[r.name for r in rnns]}")
    elif not rnns:
        raise ValueError(f"{where}: the model has no LSTM or GRU node")
    else:
        chain = rnns if len(rnns) == 1 else _onnx_chain(model, rnns, consts, where)
    layers = [_onnx_node_arrays(n, consts, where) for n in chain]
    kind, I, H, first = layers[0]
    D = len(first)
    for n, (kind_k, I_k, H_k, dirs) in zip(chain[1:], layers[1:]):
        if (kind_k, H_k, len(dirs), I_k) != (kind, H, D, D * H):
            raise ValueError(
                f"{where}: node {n.name!r} ({kind_k}, hidden_size {H_k}, {len(dirs)} "
                f"direction(s), input size {I_k}) does not continue the stack of {kind} "
                f"nodes with hidden_size {H}, {D} direction(s) (input size {D * H})")
    W0 = next(iter(first[0].values()))   # w, w_ru or weight_ih
    dt = _dtype(where, dtype, W0.dtype if W0.dtype in (np.float32, np.float64) else np.float32)
    suffixes = ("", "_reverse")
    arrays = {f"{name}_l{k}{suffixes[d]}": a
              for k, (_, _, _, dirs) in enumerate(layers)
              for d, direction in enumerate(dirs) for name, a in direction.items()}
    if kind == "GRU":
        reset_after = "weight_ih" in first[0]
        for n, (_, _, _, dirs) in zip(chain[1:], layers[1:]):
            if ("weight_ih" in dirs[0]) != reset_after:
                raise ValueError(f"{where}: GRU node {n.name!r} has another "
                                 f"linear_before_reset than node {chain[0].name!r}")
        return _fill(GRU(I, H, len(layers), bidirectional=D == 2, reset_after=reset_after,
                         dtype=dt), **arrays)
    out = LSTM(I, H, len(layers), bidirectional=D == 2,
               use_peephole=any(k.startswith("wci") for k in arrays), dtype=dt)
    zeros = {k: np.zeros_like(v) for k, v in out.params.items() if k not in arrays}
    return _fill(out, **arrays, **zeros)

"""blockrnn.convert: weights from Keras 3 and PyTorch layers give the source's outputs.

Keras (TensorFlow backend, from tensorflow-cpu) and PyTorch are required: missing ones
FAIL these tests.
"""
import copy
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
try:
    import keras
    import torch
    from torch import nn
except ImportError as exc:  # pragma: no cover - depends on the environment
    pytest.fail(f"Keras (tensorflow-cpu) and PyTorch are required for the convert tests "
                f"({exc!r}); install the test extras with `pip install -e .[test]`",
                pytrace=False)

import blockrnn.torch as bt
from blockrnn import convert
from blockrnn.layers import GRU, LSTM

T, B, I, H = 7, 3, 4, 5


def _x(dtype=np.float32, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (B, T, I)).astype(dtype)  # batch-major


def _keras(layer_cls, seed, **kw):
    keras.utils.set_random_seed(seed)
    layer = layer_cls(H, return_sequences=True, return_state=True, **kw)
    layer(_x())        # build
    if layer.cell.use_bias:   # non-trivial biases (Keras initialises them to 0 / 1)
        b = np.random.default_rng(seed).uniform(-0.5, 0.5, tuple(layer.cell.bias.shape))
        layer.cell.bias.assign(b.astype(np.float32))
    return layer


@pytest.mark.parametrize("use_bias", [True, False])
def test_from_keras_lstm(use_bias):
    layer = _keras(keras.layers.LSTM, 1, use_bias=use_bias)
    ours = convert.from_keras(layer)
    assert isinstance(ours, LSTM) and ours.dtype == np.float32
    assert (ours.input_size, ours.hidden_size) == (I, H)
    x = _x(seed=2)
    h0 = np.random.default_rng(3).uniform(-1, 1, (B, H)).astype(np.float32)
    c0 = np.random.default_rng(4).uniform(-1, 1, (B, H)).astype(np.float32)
    y_k, h_k, c_k = (np.asarray(t) for t in layer(x, initial_state=[h0, c0]))
    y, (h, c), _ = ours.forward(x.transpose(1, 0, 2), (h0[None], c0[None]))
    np.testing.assert_allclose(y.transpose(1, 0, 2), y_k, rtol=0, atol=2e-6)
    np.testing.assert_allclose(h[0], h_k, rtol=0, atol=2e-6)
    np.testing.assert_allclose(c[0], c_k, rtol=0, atol=2e-6)
    # float64 conversion of the same weights agrees too
    ours64 = convert.from_keras(layer, dtype=np.float64)
    y64, _, _ = ours64.forward(x.transpose(1, 0, 2).astype(np.float64),
                               (h0[None].astype(np.float64), c0[None].astype(np.float64)))
    np.testing.assert_allclose(y64.transpose(1, 0, 2), y_k, rtol=0, atol=2e-6)


@pytest.mark.parametrize("use_bias", [True, False])
def test_from_keras_gru_reset_before(use_bias):
    layer = _keras(keras.layers.GRU, 5, reset_after=False, use_bias=use_bias)
    ours = convert.from_keras(layer)
    assert isinstance(ours, GRU) and not ours.reset_after
    x = _x(seed=6)
    h0 = np.random.default_rng(7).uniform(-1, 1, (B, H)).astype(np.float32)
    y_k, h_k = (np.asarray(t) for t in layer(x, initial_state=[h0]))
    y, h, _ = ours.forward(x.transpose(1, 0, 2), h0[None])
    np.testing.assert_allclose(y.transpose(1, 0, 2), y_k, rtol=0, atol=2e-6)
    np.testing.assert_allclose(h[0], h_k, rtol=0, atol=2e-6)


@pytest.mark.parametrize("use_bias", [True, False])
def test_from_keras_gru_reset_after(use_bias):
    """Keras 3's default GRU (reset_after=True, bias (2, 3H), gate columns z, r, h) is
    nn.GRU's: the converted GRU(reset_after=True) gives Keras' outputs and state."""
    layer = _keras(keras.layers.GRU, 8, use_bias=use_bias)
    assert layer.cell.reset_after
    if use_bias:
        assert tuple(layer.cell.bias.shape) == (2, 3 * H)
    ours = convert.from_keras(layer)
    assert isinstance(ours, GRU) and ours.reset_after and ours.dtype == np.float32
    kernel, recurrent = (np.asarray(v) for v in (layer.cell.kernel, layer.cell.recurrent_kernel))
    np.testing.assert_array_equal(ours.weight_ih_l0[:H], kernel[:, H:2 * H].T)     # r
    np.testing.assert_array_equal(ours.weight_hh_l0[H:2 * H], recurrent[:, :H].T)  # z
    x = _x(seed=9)
    h0 = np.random.default_rng(10).uniform(-1, 1, (B, H)).astype(np.float32)
    y_k, h_k = (np.asarray(t) for t in layer(x, initial_state=[h0]))
    y, h, _ = ours.forward(x.transpose(1, 0, 2), h0[None])
    np.testing.assert_allclose(y.transpose(1, 0, 2), y_k, rtol=0, atol=2e-6)
    np.testing.assert_allclose(h[0], h_k, rtol=0, atol=2e-6)
    ours64 = convert.from_keras(layer, dtype=np.float64)
    y64, _, _ = ours64.forward(x.transpose(1, 0, 2).astype(np.float64),
                               h0[None].astype(np.float64))
    np.testing.assert_allclose(y64.transpose(1, 0, 2), y_k, rtol=0, atol=2e-6)


def test_from_keras_refusals():
    with pytest.raises(ValueError, match="activation='tanh'.*got 'relu'"):
        convert.from_keras(_keras(keras.layers.LSTM, 0, activation="relu"))
    with pytest.raises(ValueError, match="recurrent_activation='sigmoid'.*'hard_sigmoid'"):
        convert.from_keras(_keras(keras.layers.LSTM, 0, recurrent_activation="hard_sigmoid"))
    with pytest.raises(ValueError, match="go_backwards"):
        convert.from_keras(_keras(keras.layers.LSTM, 0, go_backwards=True))
    with pytest.raises(ValueError, match="no weights yet"):
        convert.from_keras(keras.layers.LSTM(H))
    with pytest.raises(TypeError, match="expected a keras.layers.LSTM or keras.layers.GRU"):
        convert.from_keras(keras.layers.Dense(H))


@pytest.mark.parametrize("bias", [True, False])
def test_from_torch_lstm(bias):
    torch.manual_seed(0)
    ref = nn.LSTM(I, H, bias=bias).double()
    ours = convert.from_torch(ref)
    assert isinstance(ours, LSTM) and ours.dtype == np.float64
    x = _x(np.float64, seed=8).transpose(1, 0, 2).copy()          # time-major
    h0 = np.random.default_rng(9).uniform(-1, 1, (B, H))
    c0 = np.random.default_rng(10).uniform(-1, 1, (B, H))
    with torch.no_grad():
        y_t, (h_t, c_t) = ref(torch.from_numpy(x), (torch.from_numpy(h0)[None],
                                                    torch.from_numpy(c0)[None]))
    y, (h, c), _ = ours.forward(x, (h0[None], c0[None]))
    np.testing.assert_allclose(y, y_t.numpy(), rtol=0, atol=1e-13)
    np.testing.assert_allclose(h, h_t.numpy(), rtol=0, atol=1e-13)
    np.testing.assert_allclose(c, c_t.numpy(), rtol=0, atol=1e-13)
    f32 = convert.from_torch(ref, dtype=np.float32)
    assert f32.dtype == np.float32 and f32.w_l0.dtype == np.float32


def _nn_lstm_padded(ref, x, lengths, h0, c0):
    """nn.LSTM on a padded time-major batch: pack_padded_sequence(enforce_sorted=False),
    then pad_packed_sequence back to T steps. Returns y, h_n, c_n as NumPy."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    packed = pack_padded_sequence(torch.from_numpy(x), torch.as_tensor(lengths),
                                  enforce_sorted=False)
    with torch.no_grad():
        y, (h, c) = ref(packed, (torch.from_numpy(h0), torch.from_numpy(c0)))
    y, _ = pad_packed_sequence(y, total_length=x.shape[0])
    return y.numpy(), h.numpy(), c.numpy()


LENGTHS = np.array([7, 1, 4])    # unsorted, with a length-1 row (pack needs lengths >= 1)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 1e-5)],
                         ids=["float64", "float32"])
@pytest.mark.parametrize("bias", [True, False])
def test_from_torch_stacked_bidirectional_lstm(dtype, tol, bias):
    """nn.LSTM(num_layers=2, bidirectional=True) -> the NumPy layer: outputs and final
    states agree on padded input with per-row lengths (nn.LSTM given the packed batch)
    and on full-length input."""
    torch.manual_seed(3)
    ref = nn.LSTM(I, H, num_layers=2, bias=bias, bidirectional=True)
    ref = ref.double() if dtype == np.float64 else ref
    ours = convert.from_torch(ref)
    assert isinstance(ours, LSTM) and ours.dtype == dtype
    assert (ours.num_layers, ours.bidirectional) == (2, True)
    assert list(ours.params) == [f"{n}_l{k}{s}" for k in range(2) for s in ("", "_reverse")
                                 for n in ("w", "b")]
    rng = np.random.default_rng(13)
    x = rng.uniform(-1, 1, (T, B, I)).astype(dtype)
    h0, c0 = (rng.uniform(-1, 1, (4, B, H)).astype(dtype) for _ in range(2))
    y_t, h_t, c_t = _nn_lstm_padded(ref, x, LENGTHS, h0, c0)
    y, (h, c), _ = ours.forward(x, (h0, c0), sequence_length=LENGTHS)
    assert y.shape == (T, B, 2 * H) and h.shape == c.shape == (4, B, H)
    for got, want in ((y, y_t), (h, h_t), (c, c_t)):
        np.testing.assert_allclose(got, want, rtol=0, atol=tol)
    assert not np.any(y[1:, 1])                       # padding stays zero
    with torch.no_grad():
        y_t, (h_t, c_t) = ref(torch.from_numpy(x), (torch.from_numpy(h0),
                                                     torch.from_numpy(c0)))
    y, (h, c), _ = ours.forward(x, (h0, c0))
    for got, want in ((y, y_t), (h, h_t), (c, c_t)):
        np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=tol)


def test_from_torch_three_layers_float32_module_to_float64_layer():
    torch.manual_seed(4)
    ref = nn.LSTM(I, H, num_layers=3)
    ours = convert.from_torch(ref, dtype=np.float64)
    assert ours.dtype == np.float64 and ours.num_layers == 3 and not ours.bidirectional
    for k in range(3):
        np.testing.assert_array_equal(ours.params[f"w_l{k}"][-H:].T,
                                      getattr(ref, f"weight_hh_l{k}").detach().double())


def test_from_blockrnn_torch_modules():
    import blockrnn.torch as bt
    from blockrnn.layers import GRU as NpGRU
    x = _x(np.float64, seed=11).transpose(1, 0, 2).copy()
    torch.manual_seed(5)
    for module in (bt.LSTM(I, H, use_peephole=True, cell_clip=2.0).double(),
                   bt.GRU(I, H, reset_after=False).double(),
                   bt.LSTM(I, H, 2, bidirectional=True, use_peephole=True, cell_clip=2.0,
                           forget_bias=0.5, dtype=torch.float64),
                   bt.LSTM(I, H, 2, bias=False, bidirectional=True, dtype=torch.float64),
                   bt.GRU(I, H, 3, bias=False, bidirectional=True, reset_after=False,
                          dtype=torch.float64),
                   bt.GRU(I, H, 2, bidirectional=True, dtype=torch.float64),
                   bt.GRU(I, H, bias=False, dtype=torch.float64)):
        ours = convert.from_torch(module)
        assert isinstance(ours, NpGRU if isinstance(module, bt.GRU) else LSTM)
        if isinstance(module, bt.GRU):
            assert ours.reset_after == module.reset_after
        assert (ours.num_layers, ours.bidirectional) == (module.num_layers,
                                                         module.bidirectional)
        named = {k: v.detach().numpy() for k, v in module.named_parameters()}
        if isinstance(module, bt.LSTM):        # nn.LSTM's parameters -> TensorFlow's layout
            H_ = module.hidden_size
            for _, _, sfx, _ in module._cells():
                w_ih, w_hh = named.pop(f"weight_ih{sfx}"), named.pop(f"weight_hh{sfx}")
                named[f"w{sfx}"] = np.concatenate([w_ih.T, w_hh.T])
                b = (named.pop(f"bias_ih{sfx}") + named.pop(f"bias_hh{sfx}") if module.bias
                     else np.zeros(4 * H_))
                b[H_:2 * H_] += module.forget_bias
                named[f"b{sfx}"] = b
                for tf_name, name in zip(("wci", "wcf", "wco"), bt._PEEPHOLES):
                    if module.use_peephole:
                        named[f"{tf_name}{sfx}"] = named.pop(f"{name}{sfx}")
        for k, v in ours.params.items():
            if k in named:
                np.testing.assert_array_equal(v, named[k], err_msg=k)
            else:            # bias=False: the module has no biases, the layer's are zero
                assert not module.bias and k.startswith("b") and not np.any(v), k
        with torch.no_grad():
            y_t, s_t = module(torch.from_numpy(x), sequence_length=LENGTHS)
        y, s, _ = ours.forward(x, sequence_length=LENGTHS)
        np.testing.assert_allclose(y, y_t.numpy(), rtol=0, atol=1e-13)
        for got, want in zip(s if isinstance(s, tuple) else (s,),
                             s_t if isinstance(s_t, tuple) else (s_t,)):
            np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-13)


@pytest.mark.parametrize("L,bidirectional,bias", [(1, False, True), (2, True, True),
                                                  (3, True, False), (2, False, False)])
def test_from_torch_nn_gru(L, bidirectional, bias):
    """nn.GRU (any layers, direction, bias) -> GRU(reset_after=True) with nn.GRU's own
    parameter names, giving nn.GRU's output and final state (float64, 1e-12), also with a
    batch_first module (the layer is time-major)."""
    torch.manual_seed(L)
    ref = nn.GRU(I, H, L, bidirectional=bidirectional, bias=bias, batch_first=L == 3).double()
    ours = convert.from_torch(ref)
    assert isinstance(ours, GRU) and ours.reset_after and ours.dtype == np.float64
    assert (ours.num_layers, ours.bidirectional) == (L, bidirectional)
    named = dict(ref.named_parameters())
    for k, v in ours.params.items():
        if k in named:
            np.testing.assert_array_equal(v, named[k].detach().numpy(), err_msg=k)
        else:
            assert not bias and k.startswith("bias") and not np.any(v), k
    D = 2 if bidirectional else 1
    x = _x(np.float64, seed=12).transpose(1, 0, 2).copy()          # time-major
    h0 = np.random.default_rng(13).uniform(-1, 1, (L * D, B, H))
    with torch.no_grad():
        tx = torch.from_numpy(x.transpose(1, 0, 2).copy() if ref.batch_first else x)
        y_t, h_t = ref(tx, torch.from_numpy(h0))
    y_t = y_t.numpy().transpose(1, 0, 2) if ref.batch_first else y_t.numpy()
    y, h_n, _ = ours.forward(x, h0)
    np.testing.assert_allclose(y, y_t, rtol=0, atol=1e-12)
    np.testing.assert_allclose(h_n, h_t.numpy(), rtol=0, atol=1e-12)
    assert convert.from_torch(ref, dtype=np.float32).dtype == np.float32


@pytest.mark.parametrize("make", [
    lambda: nn.LSTM(I, H, 2, bidirectional=True),
    lambda: nn.GRU(I, H, 2, bidirectional=True),
    lambda: bt.GRU(I, H, reset_after=False),
], ids=["nn.LSTM", "nn.GRU", "bt.GRU-reset-before"])
def test_from_torch_parametrized_module(make):
    """A module whose input weights are weight_norm-parametrized converts with the
    weights its forward computes (named_parameters holds the parametrization's
    originals instead; the GRUs' conversion read those and failed): the layer gives
    the module's output (float64, 1e-12)."""
    from torch.nn.utils.parametrizations import weight_norm
    torch.manual_seed(7)
    module = make().double()
    first = "w_ru_l0" if isinstance(module, bt.GRU) else "weight_ih_l0"
    weight_norm(module, first)
    with torch.no_grad():
        module.parametrizations[first].original0.mul_(1.5)    # norm != the weight's own
    ours = convert.from_torch(module)
    x = _x(np.float64, seed=15).transpose(1, 0, 2).copy()          # time-major
    with torch.no_grad():
        y_t = module(torch.from_numpy(x))[0].numpy()
    np.testing.assert_allclose(ours.forward(x)[0], y_t, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("make", [
    lambda: nn.LSTM(I, H, 2, bidirectional=True),
    lambda: nn.GRU(I, H, 2, bidirectional=True),
    lambda: bt.LSTM(I, H, use_peephole=True, forget_bias=0.5),
    lambda: bt.GRU(I, H, reset_after=False),
], ids=["nn.LSTM", "nn.GRU", "bt.LSTM", "bt.GRU-reset-before"])
def test_from_torch_low_precision_module(make, dtype):
    """A bfloat16 / float16 module converts to a float32 layer holding its values
    exactly (NumPy has no bfloat16; the torch modules compute both in float32): the
    same arrays as from its float32 copy, and the torch module's output to the dtype's
    rounding. dtype=float64 widens them exactly too."""
    torch.manual_seed(6)
    module = make().to(dtype)
    ours = convert.from_torch(module)
    assert ours.dtype == np.float32
    want = convert.from_torch(copy.deepcopy(module).float())
    assert list(ours.params) == list(want.params)
    for k, v in ours.params.items():
        np.testing.assert_array_equal(v, want.params[k], err_msg=k)
    wide = convert.from_torch(module, dtype=np.float64)
    for k, v in wide.params.items():
        np.testing.assert_array_equal(v, ours.params[k].astype(np.float64), err_msg=k)
    x = torch.from_numpy(_x(seed=14).transpose(1, 0, 2).copy()).to(dtype)  # (T, B, I)
    if not isinstance(module, (bt.LSTM, bt.GRU)):
        return     # nn's own low-precision modules round at every step: not compared
    with torch.no_grad():
        y_t = module(x)[0]
    y = ours.forward(x.float().numpy())[0]
    np.testing.assert_array_equal(torch.from_numpy(y).to(dtype).float(), y_t.float())


@pytest.mark.filterwarnings("ignore:Complex modules:UserWarning")  # torch's, on complex64
def test_from_torch_refusals():
    with pytest.raises(ValueError, match="proj_size"):
        convert.from_torch(nn.LSTM(I, H, proj_size=2))
    with pytest.raises(TypeError, match="bfloat16 or float16, got torch.complex64"):
        convert.from_torch(nn.GRU(I, H).to(torch.complex64))
    for reset_after in (True, False):    # (False: its first parameter is w_ru_l0)
        with pytest.raises(TypeError, match="GRU module weights must be float32, float64, "
                                            "bfloat16 or float16, got torch.complex64"):
            convert.from_torch(bt.GRU(I, H, reset_after=reset_after).to(torch.complex64))
    with pytest.raises(TypeError, match="expected a torch.nn.LSTM"):
        convert.from_torch(nn.RNN(I, H))
    with pytest.raises(TypeError, match="expected a torch.nn.LSTM"):
        convert.from_torch("not a module")


@pytest.mark.parametrize("bias", [True, False])
def test_nn_lstm_arrays_stacked_bidirectional(bias):
    """Names, order and values of nn_lstm_arrays for a 3-layer bidirectional nn.LSTM."""
    import blockrnn.torch as bt
    torch.manual_seed(0)
    ref = nn.LSTM(I, H, num_layers=3, bias=bias, bidirectional=True, batch_first=True).double()
    a = bt.nn_lstm_arrays(ref)
    assert {k: v for k, v in a.items() if k != "params"} == {
        "input_size": I, "hidden_size": H, "num_layers": 3, "bidirectional": True,
        "batch_first": True, "bias": bias, "torch_dtype": torch.float64}
    names = [f"{p}_l{k}{s}" for k in range(3) for s in ("", "_reverse") for p in ("w", "b")]
    assert list(a["params"]) == names
    for k in range(3):
        I_k = I if k == 0 else 2 * H
        for s in ("", "_reverse"):
            w, b = a["params"][f"w_l{k}{s}"], a["params"][f"b_l{k}{s}"]
            assert w.shape == (I_k + H, 4 * H) and b.shape == (4 * H,)
            assert w.dtype == b.dtype == np.float64
            np.testing.assert_array_equal(w[:I_k].T, getattr(ref, f"weight_ih_l{k}{s}").detach())
            np.testing.assert_array_equal(w[I_k:].T, getattr(ref, f"weight_hh_l{k}{s}").detach())
            want = (getattr(ref, f"bias_ih_l{k}{s}") + getattr(ref, f"bias_hh_l{k}{s}")
                    ).detach().numpy() if bias else np.zeros(4 * H)
            np.testing.assert_array_equal(b, want)


def test_nn_lstm_arrays_gate_order_runs_like_nn_lstm():
    """w_l0 / b_l0 of a one-layer nn.LSTM fed to block_lstm_v2 reproduce nn.LSTM (IFCO)."""
    import blockrnn
    import blockrnn.torch as bt
    torch.manual_seed(1)
    ref = nn.LSTM(I, H).double()
    p = bt.nn_lstm_arrays(ref)["params"]
    assert list(p) == ["w_l0", "b_l0"]
    x = _x(np.float64, seed=12).transpose(1, 0, 2).copy()
    zeros = np.zeros((B, H))
    fwd = blockrnn.block_lstm_v2(T, x, zeros, zeros, p["w_l0"], zeros[0], zeros[0], zeros[0],
                                 p["b_l0"])
    with torch.no_grad():
        y_t = ref(torch.from_numpy(x))[0].numpy()
    np.testing.assert_allclose(fwd.h, y_t, rtol=0, atol=1e-13)


@pytest.mark.filterwarnings("ignore:Complex modules:UserWarning")  # torch's, on complex64
def test_nn_lstm_arrays_refusals():
    import blockrnn.torch as bt
    with pytest.raises(ValueError, match="proj_size=2"):
        bt.nn_lstm_arrays(nn.LSTM(I, H, num_layers=2, bidirectional=True, proj_size=2))
    with pytest.raises(ValueError, match="reset gate AFTER"):
        bt.nn_lstm_arrays(nn.GRU(I, H))
    with pytest.raises(TypeError, match="expected a torch.nn.LSTM, got Linear"):
        bt.nn_lstm_arrays(nn.Linear(I, H))
    with pytest.raises(TypeError, match="bfloat16 or float16, got torch.complex64"):
        bt.nn_lstm_arrays(nn.LSTM(I, H).to(torch.complex64))

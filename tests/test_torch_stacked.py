"""blockrnn.torch with nn.LSTM's whole interface: stacked layers, both directions,
dropout, PackedSequence input, nn.LSTM's constructor and detachable states.

PyTorch is required (the test extras install it): a missing torch FAILS these tests.
"""
import warnings

import numpy as np
import pytest

try:
    import torch
    from torch import nn
    from torch.nn.utils.rnn import (PackedSequence, pack_padded_sequence,
                                    pad_packed_sequence)
except ImportError as exc:  # pragma: no cover - depends on the environment
    pytest.fail(f"PyTorch is required for the blockrnn.torch tests ({exc!r}); install the "
                f"test extras with `pip install -e .[test]`", pytrace=False)

import blockrnn
import blockrnn.torch as bt

T, B, I, H, L = 6, 4, 5, 3, 2
LENGTHS = [6, 1, 4, 3]          # unsorted, with a length-1 row


def _rand(*shape, dtype=torch.float64, seed=0, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(*shape, generator=g, dtype=dtype) * 2 - 1
    return t.requires_grad_(requires_grad)


def _weights(shape, dtype, seed=11):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g, dtype=dtype)


def _loss(y, h_n, c_n):
    """A loss that weighs every output and state element differently."""
    return ((y * _weights(y.shape, y.dtype)).sum() + (h_n ** 2).sum()
            + (c_n * _weights(c_n.shape, c_n.dtype, seed=12)).sum())


def _max_diff(a, b):
    return float((a.detach() - b.detach()).abs().max())


def _param_grad_diffs(ours, ref):
    """max |grad difference| per nn.LSTM parameter (the same names on both sides)."""
    mine = dict(ours.named_parameters())
    assert list(mine) == [n for n, _ in ref.named_parameters()]   # every parameter compared
    return {n: _max_diff(mine[n].grad, p.grad) for n, p in ref.named_parameters()}


def parity_vs_nn_lstm(dtype, packed, bias=True, batch_first=False):
    """Run nn.LSTM(num_layers=2, bidirectional=True) and its from_torch copy on the same
    input (padded with sequence_length, or an unsorted PackedSequence) and return the
    max abs differences: {"output", "h_n", "c_n", "x.grad", "h0.grad", "c0.grad",
    "params": {nn.LSTM parameter name: max abs grad difference}}."""
    torch.manual_seed(0)
    ref = nn.LSTM(I, H, L, bias=bias, batch_first=batch_first, bidirectional=True).to(dtype)
    ours = bt.LSTM.from_torch(ref)
    lengths = torch.tensor(LENGTHS)
    xs = [_rand(B, T, I, dtype=dtype, seed=1) if batch_first else
          _rand(T, B, I, dtype=dtype, seed=1) for _ in range(2)]
    h0s = [_rand(2 * L, B, H, dtype=dtype, seed=2) for _ in range(2)]
    c0s = [_rand(2 * L, B, H, dtype=dtype, seed=3) for _ in range(2)]
    pk = lambda x: pack_padded_sequence(x, lengths, batch_first=batch_first,  # noqa: E731
                                        enforce_sorted=False)
    y_ref, (h_ref, c_ref) = ref(pk(xs[0]), (h0s[0], c0s[0]))
    if packed:
        y, (h, c) = ours(pk(xs[1]), (h0s[1], c0s[1]))
        assert isinstance(y, PackedSequence)
        assert torch.equal(y.batch_sizes, y_ref.batch_sizes)
        assert torch.equal(y.sorted_indices, y_ref.sorted_indices)
        assert torch.equal(y.unsorted_indices, y_ref.unsorted_indices)
        y, y_ref = y.data, y_ref.data
    else:
        y, (h, c) = ours(xs[1], (h0s[1], c0s[1]), sequence_length=lengths)
        y_ref, _ = pad_packed_sequence(y_ref, batch_first=batch_first, total_length=T)
    assert y.shape == y_ref.shape and h.shape == c.shape == (2 * L, B, H)
    _loss(y_ref, h_ref, c_ref).backward()
    _loss(y, h, c).backward()
    return {"output": _max_diff(y, y_ref), "h_n": _max_diff(h, h_ref),
            "c_n": _max_diff(c, c_ref), "x.grad": _max_diff(xs[1].grad, xs[0].grad),
            "h0.grad": _max_diff(h0s[1].grad, h0s[0].grad),
            "c0.grad": _max_diff(c0s[1].grad, c0s[0].grad),
            "params": _param_grad_diffs(ours, ref)}


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)],
                         ids=["float64", "float32"])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed_unsorted"])
@pytest.mark.parametrize("bias,batch_first", [(True, False), (False, True)],
                         ids=["bias", "nobias_batch_first"])
def test_stacked_bidirectional_matches_nn_lstm(dtype, tol, packed, bias, batch_first):
    diffs = parity_vs_nn_lstm(dtype, packed, bias, batch_first)
    params = diffs.pop("params")
    assert max(diffs.values()) < tol, diffs
    assert max(params.values()) < tol, params


def test_packed_sorted_and_h_n_in_input_order():
    """enforce_sorted=True input: no indices; h_n / c_n rows follow the caller's rows."""
    torch.manual_seed(0)
    ref = nn.LSTM(I, H, L, bidirectional=True).double()
    ours = bt.LSTM.from_torch(ref)
    x = _rand(T, B, I, seed=1, requires_grad=False)
    lengths = torch.tensor(sorted(LENGTHS, reverse=True))
    packed = pack_padded_sequence(x, lengths)
    y, (h, c) = ours(packed)
    y_ref, (h_ref, c_ref) = ref(packed)
    assert y.sorted_indices is None and y.unsorted_indices is None
    for a, r in ((y.data, y_ref.data), (h, h_ref), (c, c_ref)):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12)
    # Unsorted: row b of h_n belongs to row b of the input, as in nn.LSTM.
    perm = torch.tensor([2, 0, 3, 1])
    y2, (h2, c2) = ours(pack_padded_sequence(x[:, perm], lengths[perm], enforce_sorted=False))
    torch.testing.assert_close(h2, h[:, perm], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(c2, c[:, perm], rtol=1e-12, atol=1e-12)


def test_unbatched_stacked_bidirectional_matches_nn_lstm():
    torch.manual_seed(0)
    ref = nn.LSTM(I, H, L, bidirectional=True).double()
    ours = bt.LSTM.from_torch(ref)
    x = _rand(T, I, seed=1, requires_grad=False)
    h0, c0 = _rand(2 * L, H, seed=2, requires_grad=False), _rand(2 * L, H, seed=3,
                                                                  requires_grad=False)
    y, (h, c) = ours(x, (h0, c0))
    y_ref, (h_ref, c_ref) = ref(x, (h0, c0))
    assert y.shape == (T, 2 * H) and h.shape == c.shape == (2 * L, H)
    for a, r in ((y, y_ref), (h, h_ref), (c, c_ref)):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12)


def _module_gradcheck(module, x, states, lengths):
    """gradcheck of module(x, states, sequence_length=lengths) w.r.t. x, the states and
    every parameter (through torch.func.functional_call)."""
    names = [n for n, _ in module.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in module.parameters()]
    n_states = len(states)

    def f(x, *rest):
        st, ps = rest[:n_states], rest[n_states:]
        hx = st if n_states == 2 else st[0]
        y, out = torch.func.functional_call(module, dict(zip(names, ps)), (x, hx),
                                            {"sequence_length": lengths})
        return (y, *out) if n_states == 2 else (y, out)

    return torch.autograd.gradcheck(f, (x, *states, *params), eps=1e-6, atol=1e-8,
                                    rtol=1e-6)


@pytest.mark.parametrize("lengths", [None, [4, 0, 1]], ids=["full", "lengths"])
def test_gradcheck_stacked_bidirectional_modules(lengths):
    Tg, Bg, Ig, Hg = 4, 3, 3, 2
    torch.manual_seed(0)
    lstm = bt.LSTM(Ig, Hg, 2, bidirectional=True, use_peephole=True, dtype=torch.float64)
    gru = bt.GRU(Ig, Hg, 2, bidirectional=True, dtype=torch.float64)
    gru_rb = bt.GRU(Ig, Hg, 2, bidirectional=True, reset_after=False, dtype=torch.float64)
    x = _rand(Tg, Bg, Ig, seed=1)
    h0, c0 = _rand(4, Bg, Hg, seed=2), _rand(4, Bg, Hg, seed=3)
    assert _module_gradcheck(lstm, x, (h0, c0), lengths)
    assert _module_gradcheck(gru, x, (h0,), lengths)
    assert _module_gradcheck(gru_rb, x, (h0,), lengths)


# ---------------------------------------------------------------------------
# GRU(reset_after=False) (no nn.GRU peer: reset-before math) against single-layer ops
# ---------------------------------------------------------------------------

def _hand_gru(module, x, h0, lengths):
    """The stacked bidirectional GRU composed by hand from NumPy ``block_gru`` calls and
    ``reverse_sequence`` (D21.md's formula): (y (T, B, D*H), h_n (L*D, B, H))."""
    p = {k: v.detach().numpy() for k, v in module.named_parameters()}
    n = np.full(x.shape[1], x.shape[0]) if lengths is None else np.asarray(lengths)
    rev = lambda a: blockrnn.reverse_sequence(a, n)  # noqa: E731
    layer_in, finals = x, []
    for k in range(module.num_layers):
        outs = []
        for d, sfx in enumerate(("", "_reverse")[:module.num_directions]):
            i = k * module.num_directions + d
            args = [p[f"{w}_l{k}{sfx}"] for w in ("w_ru", "w_c", "b_ru", "b_c")]
            xin = rev(layer_in) if d else layer_in
            h = blockrnn.block_gru(x.shape[0], xin, h0[i], *args, sequence_length=n).h
            last = np.where((n > 0)[:, None], h[np.maximum(n - 1, 0), np.arange(len(n))], h0[i])
            finals.append(last)
            outs.append(rev(h) if d else h)
        layer_in = np.concatenate(outs, axis=-1)
    return layer_in, np.stack(finals)


@pytest.mark.parametrize("lengths", [None, [6, 1, 0, 3]], ids=["full", "lengths"])
def test_gru_stacked_bidirectional_equals_hand_composition(lengths):
    torch.manual_seed(0)
    gru = bt.GRU(I, H, 3, bidirectional=True, reset_after=False, dtype=torch.float64)
    x = _rand(T, B, I, seed=1, requires_grad=False)
    h0 = _rand(6, B, H, seed=2, requires_grad=False)
    with torch.no_grad():
        y, h_n = gru(x, h0, sequence_length=lengths)
    y_want, h_want = _hand_gru(gru, x.numpy(), h0.numpy(), lengths)
    np.testing.assert_allclose(y.numpy(), y_want, rtol=0, atol=1e-13)
    np.testing.assert_allclose(h_n.numpy(), h_want, rtol=0, atol=1e-13)
    if lengths is not None:    # the same through a PackedSequence (no zero-length rows)
        keep = [0, 1, 3]
        packed = pack_padded_sequence(x[:, keep], torch.tensor(lengths)[keep],
                                      enforce_sorted=False)
        with torch.no_grad():
            y_p, h_p = gru(packed, h0[:, keep])
            y_p, _ = pad_packed_sequence(y_p, total_length=T)
        np.testing.assert_allclose(y_p.numpy(), y_want[:, keep], rtol=0, atol=1e-13)
        np.testing.assert_allclose(h_p.numpy(), h_want[:, keep], rtol=0, atol=1e-13)


def test_reverse_in_function_equals_autograd_gather():
    """The reverse direction's reversal inside the Function (forward and backward) gives
    the gradients of the same reversal done with torch indexing around a forward op."""
    torch.manual_seed(0)
    lengths = np.array([6, 1, 0, 3])
    x, h0 = _rand(T, B, I, seed=1), _rand(B, H, seed=2)
    gru = bt.GRU(I, H, reset_after=False, dtype=torch.float64)
    p = [gru.w_ru_l0, gru.w_c_l0, gru.b_ru_l0, gru.b_c_l0]
    wts = _weights((T, B, H), torch.float64)
    h = bt.BlockGRUFunction.apply(x, h0, *p, lengths, True)
    (h * wts).sum().backward()
    got = [t.grad.clone() for t in (x, h0, *p)]
    for t in (x, h0, *p):
        t.grad = None
    # Gather indices of the reversal: row b reads time n_b - 1 - t for t < n_b.
    t_idx = torch.arange(T)[:, None].expand(T, B)
    n = torch.from_numpy(lengths)[None]
    src = torch.where(t_idx < n, n - 1 - t_idx, t_idx)
    rev = lambda a: a[src, torch.arange(B)[None]]  # noqa: E731
    h2 = rev(bt.BlockGRUFunction.apply(rev(x), h0, *p, lengths))
    torch.testing.assert_close(h, h2, rtol=0, atol=1e-14)
    (h2 * wts).sum().backward()
    for a, t in zip(got, (x, h0, *p)):
        torch.testing.assert_close(a, t.grad, rtol=1e-13, atol=1e-13)


# ---------------------------------------------------------------------------
# Dropout
# ---------------------------------------------------------------------------

def _record_calls(monkeypatch, name):
    """Record (x, output h) of every call of the op bt.<name> (one per layer and direction)."""
    seen, op = [], getattr(bt, name)

    def spy(x, *rest):
        out = op(x, *rest)
        seen.append((x.detach().clone(), out[0].detach()))
        return out
    monkeypatch.setattr(bt, name, spy)
    return seen


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_dropout_eval_deterministic_and_train_drops_at_rate(kind, monkeypatch):
    p, Ts, Bs, Hs = 0.3, 40, 16, 24
    torch.manual_seed(0)
    cls = bt.LSTM if kind == "lstm" else bt.GRU
    model = cls(I, Hs, 3, dropout=p, bidirectional=True, dtype=torch.float64)
    plain = cls(I, Hs, 3, bidirectional=True, dtype=torch.float64)
    plain.load_state_dict(model.state_dict())
    x = _rand(Ts, Bs, I, seed=1, requires_grad=False)
    out = lambda m: m(x)[0]  # noqa: E731

    model.eval()
    y1, y2 = out(model), out(model)
    assert torch.equal(y1, y2) and torch.equal(y1, out(plain))

    seen = _record_calls(monkeypatch, "lstm_op" if kind == "lstm" else "gru_op")
    model.train()
    torch.manual_seed(1)
    y_train = out(model)
    assert len(seen) == 6             # 3 layers x 2 directions
    assert not torch.equal(y_train, y1)
    assert torch.equal(seen[0][0], x) and torch.equal(seen[1][0], x)  # input not dropped
    # Layers 1 and 2 read layer 0's / 1's output [forward | reverse] through dropout: zeros
    # at rate p, the rest scaled by 1 / (1 - p) (the outputs are never exactly zero).
    for k in (1, 2):
        a = seen[2 * k][0]
        assert torch.equal(seen[2 * k + 1][0], a)      # both directions read the same
        below = torch.cat([seen[2 * k - 2][1], seen[2 * k - 1][1]], dim=-1)
        assert not (below == 0).any()
        zero = a == 0
        frac = zero.double().mean().item()
        assert abs(frac - p) < 6 * np.sqrt(p * (1 - p) / a.numel()), (k, frac)
        torch.testing.assert_close(a[~zero], below[~zero] / (1 - p), rtol=1e-14, atol=0)
    # The last layer's output is not dropped.
    assert not (y_train == 0).any()


def test_dropout_warning_and_training_mode_kept_by_from_torch():
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        bt.LSTM(I, H, 1, dropout=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bt.LSTM(I, H, 2, dropout=0.5)
        ref = nn.LSTM(I, H, 2, dropout=0.25, bidirectional=True, bias=False, batch_first=True)
    ours = bt.LSTM.from_torch(ref.eval())
    assert (ours.num_layers, ours.bidirectional, ours.bias, ours.batch_first, ours.dropout,
            ours.training) == (2, True, False, True, 0.25, False)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert [n for n, _ in ours.named_parameters()] == [
        "weight_ih_l0", "weight_hh_l0", "weight_ih_l0_reverse", "weight_hh_l0_reverse",
        "weight_ih_l1", "weight_hh_l1", "weight_ih_l1_reverse", "weight_hh_l1_reverse"]


# ---------------------------------------------------------------------------
# Constructor, names, states
# ---------------------------------------------------------------------------

def test_positional_order_is_nn_lstm_s():
    """bt.LSTM(16, 32, 1) used to be batch_first=True; now the 3rd argument is num_layers."""
    m = bt.LSTM(I, H, 2, False, True, 0.0, True)
    ref = nn.LSTM(I, H, 2, False, True, 0.0, True)
    for attr in ("num_layers", "bias", "batch_first", "dropout", "bidirectional"):
        assert getattr(m, attr) == getattr(ref, attr), attr
    g = bt.GRU(I, H, 2, False, True, 0.1, True, device="cpu", dtype=torch.float64)
    assert (g.num_layers, g.bias, g.batch_first, g.dropout, g.bidirectional) == \
        (2, False, True, 0.1, True)
    assert bt.LSTM(I, H, 1).batch_first is False
    bt.LSTM(I, H, proj_size=0, device=torch.device("cpu"))
    with pytest.raises(TypeError):
        bt.LSTM(I, H, 1, True, False, 0.0, False, 0, True)   # use_peephole is keyword-only


def test_parameter_names_and_order():
    m = bt.LSTM(I, H, 2, bidirectional=True, use_peephole=True)
    shapes = {n: tuple(p.shape) for n, p in m.named_parameters()}
    want = []
    for k, I_k in ((0, I), (1, 2 * H)):
        for s in ("", "_reverse"):
            want += [(f"weight_ih_l{k}{s}", (4 * H, I_k)), (f"weight_hh_l{k}{s}", (4 * H, H)),
                     (f"bias_ih_l{k}{s}", (4 * H,)), (f"bias_hh_l{k}{s}", (4 * H,))]
            want += [(f"{n}_l{k}{s}", (H,)) for n in ("weight_ci", "weight_cf", "weight_co")]
    assert list(shapes.items()) == want
    assert list(m.state_dict()) == [n for n, _ in want]
    g = bt.GRU(I, H, 2, bias=False, bidirectional=True, reset_after=False)
    assert [n for n, _ in g.named_parameters()] == [
        "w_ru_l0", "w_c_l0", "w_ru_l0_reverse", "w_c_l0_reverse",
        "w_ru_l1", "w_c_l1", "w_ru_l1_reverse", "w_c_l1_reverse"]
    assert g.w_ru_l1.shape == (2 * H + H, 2 * H) and g.w_c_l1_reverse.shape == (3 * H, H)
    assert list(g.state_dict()) == [n for n, _ in g.named_parameters()]
    assert "num_layers=2" in repr(g) and "bidirectional=True" in repr(g)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("form", ["batched", "unbatched", "packed"])
def test_truncated_bptt_detach_in_place(kind, form):
    """The truncated-BPTT idiom: carry the state across chunks, h.detach_() between them."""
    torch.manual_seed(0)
    model = (bt.LSTM(I, H, 2, bidirectional=True) if kind == "lstm"
             else bt.GRU(I, H, 2, bidirectional=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    state = None
    for chunk in range(3):
        x = torch.randn(T, I) if form == "unbatched" else torch.randn(T, B, I)
        if form == "packed":
            x = pack_padded_sequence(x, torch.tensor(LENGTHS), enforce_sorted=False)
        y, state = model(x, state)
        y = y.data if form == "packed" else y
        states = state if kind == "lstm" else (state,)
        opt.zero_grad()
        (y.sum() + sum(s.sum() for s in states)).backward()
        opt.step()
        for s in states:
            assert not s._is_view()
            s.detach_()
            assert not s.requires_grad
        assert states[0].shape == ((2 * L, H) if form == "unbatched" else (2 * L, B, H))


def test_constructor_and_call_errors():
    with pytest.raises(ValueError, match="proj_size has to be smaller than hidden_size"):
        bt.LSTM(I, H, proj_size=H)
    for device in ("cuda", "cuda:0", torch.device("xpu")):
        with pytest.raises(ValueError, match="CPU only; device must be None, 'cpu' or 'meta'"):
            bt.LSTM(I, H, device=device)
        with pytest.raises(ValueError, match="CPU only; device must be None, 'cpu' or 'meta'"):
            bt.GRU(I, H, device=device)
    with pytest.raises(ValueError, match="device must be None, 'cpu' or 'meta', got 'gpu!'"):
        bt.LSTM(I, H, device="gpu!")
    for dropout in (-0.1, 1.5, "0.5", True):
        with pytest.raises(ValueError, match=r"dropout must be a number in \[0, 1\]"):
            bt.LSTM(I, H, 2, dropout=dropout)
    with pytest.raises(ValueError, match="num_layers must be positive, got 0"):
        bt.GRU(I, H, 0)
    with pytest.raises(TypeError, match="num_layers must be an int, got float"):
        bt.LSTM(I, H, 1.5)
    m = bt.LSTM(I, H, 2, bidirectional=True)
    x = torch.zeros(T, B, I)
    with pytest.raises(ValueError, match=r"h0 must have shape \(4, 4, 3\) \(num_layers \* "
                                         r"num_directions = 4, B, H\), got \(1, 4, 3\)"):
        m(x, (torch.zeros(1, B, H), torch.zeros(4, B, H)))
    with pytest.raises(ValueError, match=r"hx must have shape \(2, 3\)"):
        bt.GRU(I, H, 2)(torch.zeros(T, I), torch.zeros(2, B, H))
    packed = pack_padded_sequence(x, torch.tensor(LENGTHS), enforce_sorted=False)
    with pytest.raises(ValueError, match="sequence_length must be None with a PackedSequence"):
        m(packed, sequence_length=LENGTHS)
    with pytest.raises(TypeError, match="input.data has dtype torch.float64"):
        m(pack_padded_sequence(x.double(), torch.tensor(LENGTHS), enforce_sorted=False))
    with pytest.raises(ValueError, match=r"PackedSequence's data must have shape \(N, I\)"):
        m(pack_padded_sequence(torch.zeros(T, B, I + 1), torch.tensor(LENGTHS),
                               enforce_sorted=False))


# ---------------------------------------------------------------------------
# The NumPy layers (blockrnn.LSTM / GRU) against the torch modules
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["lstm", "gru", "gru_reset_after"])
@pytest.mark.parametrize("lengths", [None, [6, 1, 0, 3]], ids=["full", "lengths"])
def test_numpy_layers_equal_torch_modules(kind, lengths):
    """Same weights (the same names): outputs, final states, input/state gradients and
    every parameter gradient agree (float64)."""
    torch.manual_seed(0)
    if kind == "lstm":
        mod = bt.LSTM(I, H, 2, bidirectional=True, use_peephole=True, cell_clip=0.5,
                      forget_bias=0.25, dtype=torch.float64)
        layer = blockrnn.LSTM(I, H, 2, bidirectional=True, use_peephole=True, cell_clip=0.5,
                              dtype=np.float64)
        values = bt.nn_lstm_arrays(mod)["params"]      # w = [W_ih.T; W_hh.T], b = sum
    else:
        ra = kind == "gru_reset_after"
        mod = bt.GRU(I, H, 2, bidirectional=True, reset_after=ra, dtype=torch.float64)
        layer = blockrnn.GRU(I, H, 2, bidirectional=True, reset_after=ra, dtype=np.float64)
        values = {n: p.detach().numpy() for n, p in mod.named_parameters()}
    assert list(layer.params) == list(values)
    for n, v in values.items():
        layer.params[n][...] = v
    x = _rand(T, B, I, seed=1)
    states = [_rand(2 * L, B, H, seed=2 + k) for k in range(2 if kind == "lstm" else 1)]
    hx = tuple(states) if kind == "lstm" else states[0]
    y, out = mod(x, hx, sequence_length=lengths)
    outs = out if kind == "lstm" else (out,)
    wy = _weights(y.shape, torch.float64)
    ws = [_weights(o.shape, torch.float64, seed=20 + k) for k, o in enumerate(outs)]
    ((y * wy).sum() + sum((o * w).sum() for o, w in zip(outs, ws))).backward()

    np_state = tuple(s.detach().numpy() for s in states)
    y_np, out_np, ctx = layer.forward(x.detach().numpy(),
                                      np_state if kind == "lstm" else np_state[0],
                                      sequence_length=lengths)
    ws_np = tuple(w.numpy() for w in ws)
    dx, ds0 = layer.backward(ctx, wy.numpy(), ws_np if kind == "lstm" else ws_np[0])
    outs_np = out_np if kind == "lstm" else (out_np,)
    ds0 = ds0 if kind == "lstm" else (ds0,)
    close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)  # noqa
    close(y.detach().numpy(), y_np)
    for o, o_np in zip(outs, outs_np):
        close(o.detach().numpy(), o_np)
    close(x.grad.numpy(), dx)
    for s, g in zip(states, ds0):
        close(s.grad.numpy(), g)
    grads = {n: p.grad.numpy() for n, p in mod.named_parameters()}
    if kind == "lstm":     # the layer's w / b gradients mapped back to nn.LSTM's parameters
        for _, _, sfx, I_k in mod._cells():
            close(grads[f"weight_ih{sfx}"], layer.grads[f"w{sfx}"][:I_k].T)
            close(grads[f"weight_hh{sfx}"], layer.grads[f"w{sfx}"][I_k:].T)
            close(grads[f"bias_ih{sfx}"], layer.grads[f"b{sfx}"])
            close(grads[f"bias_hh{sfx}"], layer.grads[f"b{sfx}"])
            for tf_name, name in zip(("wci", "wcf", "wco"), bt._PEEPHOLES):
                close(grads[f"{name}{sfx}"], layer.grads[f"{tf_name}{sfx}"])
    else:
        for n, g in grads.items():
            close(g, layer.grads[n])

"""The projected LSTM (nn.LSTM with proj_size = P > 0; issue 27, point 3).

Oracle: torch.nn.LSTM(proj_size=P). blockrnn.torch.LSTM(proj_size=P) holds its
parameters exactly (state_dict strictly both ways, same initialisation), trains the same
(SGD with clipping, every loss to float64 rounding), gives the same outputs, states and
gradients (float64 1e-10, float32; padded and unsorted PackedSequence); the op pair
blockrnn::lstm_proj / lstm_proj_backward passes gradcheck and opcheck and traces under
torch.compile(fullgraph=True) and torch.export; the kernels (blockrnn.lstm_proj) give
bits that do not depend on the thread count. PyTorch is required: a missing torch FAILS
these tests.
"""
import itertools

import numpy as np
import pytest

try:
    import torch
    from torch import nn
    from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence
except ImportError as exc:  # pragma: no cover - depends on the environment
    pytest.fail(f"PyTorch is required for the blockrnn.torch tests ({exc!r}); install the "
                f"test extras with `pip install -e .[test]`", pytrace=False)
from threadpoolctl import threadpool_limits
from _inputs import check_kernel_variant

import blockrnn.torch as bt
from blockrnn import _kernels, convert
from blockrnn.lstm_proj import block_lstm_proj, block_lstm_proj_grad

T, B, I, H, P = 6, 4, 5, 4, 3
LENGTHS = [6, 1, 4, 3]          # unsorted, with a length-1 row

# nn.LSTM warns that oneDNN has no projection (it then runs its default path).
pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported")


def _rand(*shape, dtype=torch.float64, seed=0, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(*shape, generator=g, dtype=dtype) * 2 - 1
    return t.requires_grad_(requires_grad)


def _weights(shape, dtype, seed=11):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _pair(dtype=torch.float64, seed=0, **config):
    """(nn.LSTM, blockrnn.torch.LSTM) with proj_size P built from the same seed."""
    torch.manual_seed(seed)
    ref = nn.LSTM(I, H, proj_size=P, **config, dtype=dtype)
    torch.manual_seed(seed)
    ours = bt.LSTM(I, H, proj_size=P, **config, dtype=dtype)
    return ref, ours


CONFIGS = [dict(num_layers=L, bidirectional=d, bias=b, batch_first=f)
           for L, d, b, f in itertools.product((1, 2), (False, True), (True, False),
                                               (False, True))]


def _cfg_id(c):
    return (f"L{c['num_layers']}-{'bi' if c['bidirectional'] else 'uni'}-"
            f"{'bias' if c['bias'] else 'nobias'}-{'bf' if c['batch_first'] else 'tm'}")


# ---------------------------------------------------------------------------
# Parameters and state_dict
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("config", CONFIGS, ids=_cfg_id)
def test_parameters_and_state_dict_both_ways(config):
    """Names, shapes, order and initial values are nn.LSTM's (weight_hr_l{k} included);
    a state_dict loads strictly both ways; from_torch copies configuration and weights."""
    ref, ours = _pair(**config)
    want = [(n, tuple(p.shape)) for n, p in ref.named_parameters()]
    assert [(n, tuple(p.shape)) for n, p in ours.named_parameters()] == want
    assert any(n.startswith("weight_hr") for n, _ in want)
    for p, q in zip(ours.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    torch.manual_seed(9)
    other = nn.LSTM(I, H, proj_size=P, **config, dtype=torch.float64)
    ours.load_state_dict(other.state_dict(), strict=True)
    back = nn.LSTM(I, H, proj_size=P, **config, dtype=torch.float64)
    back.load_state_dict(ours.state_dict(), strict=True)
    for (n, p), (_, q) in zip(back.named_parameters(), other.named_parameters()):
        assert torch.equal(p, q), n
    copy = bt.LSTM.from_torch(other)
    assert copy.proj_size == P and "proj_size=3" in repr(copy)
    again = bt.LSTM.from_torch(copy)         # a blockrnn module converts too
    for p, q in zip(again.parameters(), copy.parameters()):
        assert torch.equal(p, q)
    x = _rand(B, T, I, seed=1) if config["batch_first"] else _rand(T, B, I, seed=1)
    y0, (h0, c0) = other(x)
    y1, (h1, c1) = copy(x)
    assert y1.shape == y0.shape and h1.shape == h0.shape and c1.shape == c0.shape
    for a, b in ((y1, y0), (h1, h0), (c1, c0)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------
# Training: SGD + weight decay + clip_grad_norm_, step by step
# ---------------------------------------------------------------------------

class _LM(nn.Module):
    """Embedding -> 2-layer projected LSTM -> Linear."""

    def __init__(self, rnn, vocab=17):
        super().__init__()
        self.emb, self.rnn = nn.Embedding(vocab, I), rnn
        self.out = nn.Linear((2 if rnn.bidirectional else 1) * P, vocab)

    def forward(self, tokens, hidden):
        y, hidden = self.rnn(self.emb(tokens), hidden)
        return self.out(y), hidden


def _train(model, batches, steps=20):
    opt = torch.optim.SGD(model.parameters(), lr=2.0, weight_decay=1e-3)
    hidden, losses = None, []
    for step in range(steps):
        tokens, target = batches[step % len(batches)]
        opt.zero_grad()
        logits, hidden = model(tokens, hidden)
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           target.reshape(-1))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        opt.step()
        hidden = tuple(h.detach() for h in hidden)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_sgd_with_clipping_equals_nn(bidirectional):
    """20 steps of SGD (lr 2, weight decay, clip_grad_norm_ 0.25, hidden detached between
    batches) from one initial state: every loss and the final parameters equal nn's to
    float64 rounding."""
    ref_rnn, our_rnn = _pair(num_layers=2, bidirectional=bidirectional)
    torch.manual_seed(3)
    ref = _LM(ref_rnn).double()
    ours = _LM(our_rnn).double()
    ours.load_state_dict(ref.state_dict(), strict=True)
    g = torch.Generator().manual_seed(4)
    data = torch.randint(0, 17, (8 * 7 + 1, 3), generator=g)
    batches = [(data[i:i + 7], data[i + 1:i + 8]) for i in range(0, 8 * 7, 7)]
    want, got = _train(ref, batches), _train(ours, batches)
    assert want[-1] < want[0]
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=0)
    for (n, p), (_, q) in zip(ours.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=n)


# ---------------------------------------------------------------------------
# Outputs, states, gradients
# ---------------------------------------------------------------------------

def _loss(y, states):
    return (y * _weights(y.shape, y.dtype)).sum() + sum(
        (s * _weights(s.shape, s.dtype, seed=12 + k)).sum() for k, s in enumerate(states))


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)],
                         ids=["float64", "float32"])
@pytest.mark.parametrize("input_kind", ["full", "padded", "packed_unsorted"])
@pytest.mark.parametrize("layers,bidirectional,bias,batch_first",
                         [(1, False, True, False), (2, True, True, False),
                          (2, True, False, True), (2, False, True, True)],
                         ids=["L1-uni", "L2-bi", "L2-bi-nobias-bf", "L2-uni-bf"])
def test_matches_nn(dtype, tol, input_kind, layers, bidirectional, bias, batch_first):
    """nn.LSTM(proj_size=P) and the blockrnn module with the same parameters: outputs,
    h_n (L*D, B, P), c_n (L*D, B, H), input / state gradients and every parameter gradient
    agree."""
    ref, ours = _pair(dtype, num_layers=layers, bidirectional=bidirectional, bias=bias,
                      batch_first=batch_first)
    LD = layers * (2 if bidirectional else 1)
    lengths = torch.tensor(LENGTHS)
    shape = (B, T, I) if batch_first else (T, B, I)
    xs = [_rand(*shape, dtype=dtype, seed=1) for _ in range(2)]
    st = [[_rand(LD, B, P, dtype=dtype, seed=2), _rand(LD, B, H, dtype=dtype, seed=3)]
          for _ in range(2)]
    pk = lambda x: pack_padded_sequence(x, lengths, batch_first=batch_first,  # noqa: E731
                                        enforce_sorted=False)
    if input_kind == "full":
        y_ref, s_ref = ref(xs[0], tuple(st[0]))
        y, s = ours(xs[1], tuple(st[1]))
    else:
        y_ref, s_ref = ref(pk(xs[0]), tuple(st[0]))
        if input_kind == "packed_unsorted":
            y, s = ours(pk(xs[1]), tuple(st[1]))
            assert isinstance(y, PackedSequence)
            assert torch.equal(y.unsorted_indices, y_ref.unsorted_indices)
            assert torch.equal(y.batch_sizes, y_ref.batch_sizes)
            y, y_ref = y.data, y_ref.data
        else:
            y, s = ours(xs[1], tuple(st[1]), sequence_length=lengths)
            y_ref, _ = pad_packed_sequence(y_ref, batch_first=batch_first, total_length=T)
    assert y.shape[-1] == (LD // layers) * P
    assert s[0].shape == (LD, B, P) and s[1].shape == (LD, B, H)
    torch.testing.assert_close(y, y_ref, rtol=tol, atol=tol)
    for a, b in zip(s, s_ref):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    _loss(y_ref, s_ref).backward()
    _loss(y, s).backward()
    torch.testing.assert_close(xs[1].grad, xs[0].grad, rtol=tol, atol=tol)
    for a, b in zip(st[1], st[0]):
        torch.testing.assert_close(a.grad, b.grad, rtol=tol, atol=tol)
    for (n, p), (_, q) in zip(ours.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=tol, atol=tol, msg=n)


def test_unbatched_and_default_state():
    ref, ours = _pair(num_layers=2, bidirectional=True)
    x = _rand(T, I, seed=1)
    y0, (h0, c0) = ref(x)
    y1, (h1, c1) = ours(x)
    assert h1.shape == (4, P) and c1.shape == (4, H) and y1.shape == (T, 2 * P)
    for a, b in ((y1, y0), (h1, h0), (c1, c0)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------
# The kernels (blockrnn.lstm_proj): padding, seq_len_max, batch 1, threads
# ---------------------------------------------------------------------------

def _np_case(T_, B_, I_, H_, P_, dtype, seed=0):
    rng = np.random.default_rng(seed)
    r = lambda *s: rng.uniform(-1, 1, s).astype(dtype)  # noqa: E731
    return (r(T_, B_, I_), r(B_, P_), r(B_, H_), r(4 * H_, I_), r(4 * H_, P_), r(4 * H_),
            r(4 * H_), r(P_, H_))


def _np_reference(L, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, lengths):
    """nn.LSTM(proj_size) over each row's first min(L, length) steps (float64 torch)."""
    T_, B_ = x.shape[:2]
    H_, P_ = w_hr.shape[1], w_hr.shape[0]
    cell = nn.LSTM(x.shape[2], H_, proj_size=P_, dtype=torch.float64)
    with torch.no_grad():
        for p, v in zip((cell.weight_ih_l0, cell.weight_hh_l0, cell.bias_ih_l0,
                         cell.bias_hh_l0, cell.weight_hr_l0), (w_ih, w_hh, b_ih, b_hh, w_hr)):
            p.copy_(torch.from_numpy(v.astype(np.float64)))
    h = np.zeros((T_, B_, P_))
    cs = np.zeros((T_, B_, H_))
    for b in range(B_):
        n = min(L, lengths[b])
        if n == 0:
            continue
        xb = torch.from_numpy(x[:n, b:b + 1].astype(np.float64))
        state = tuple(torch.from_numpy(s[None, b:b + 1].astype(np.float64)) for s in (h0, c0))
        with torch.no_grad():
            y, _ = cell(xb, state)
            h[:n, b] = y[:, 0].numpy()
            # c at every step: run prefixes (small sizes only)
            for t in range(n):
                cs[t, b] = cell(xb[:t + 1], state)[1][1][0, 0].numpy()
    return h, cs


def test_kernel_seq_len_max_lengths_and_nan_padding():
    """seq_len_max < T, rows of length 0, batch 1: zeros past each row's length, values
    equal nn.LSTM's; the backward reads nothing past a row's length (NaN there is fine)."""
    x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr = _np_case(7, 5, 3, 6, 2, np.float64)
    lengths = np.array([7, 0, 3, 5, 1])
    L = 6
    out = block_lstm_proj(L, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, sequence_length=lengths)
    h_ref, cs_ref = _np_reference(L, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, lengths)
    np.testing.assert_allclose(out.h, h_ref, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(out.cs, cs_ref, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(out.m @ w_hr.T, out.h, rtol=1e-12, atol=1e-14)
    pad = np.arange(7)[:, None] >= np.minimum(L, lengths)[None, :]
    assert not out.h[pad].any() and not out.m[pad].any() and not out.cs[pad].any()
    rng = np.random.default_rng(1)
    gh, gc = rng.standard_normal(out.h.shape), rng.standard_normal(out.cs.shape)
    g = block_lstm_proj_grad(L, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, *out, gc, gh,
                             sequence_length=lengths)
    dirty = [a.copy() for a in out]
    for a in dirty:
        a[pad] = np.nan
    gh2, gc2 = gh.copy(), gc.copy()
    gh2[pad], gc2[pad] = np.nan, np.nan
    g2 = block_lstm_proj_grad(L, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, *dirty, gc2, gh2,
                              sequence_length=lengths)
    for a, b in zip(g, g2):
        np.testing.assert_array_equal(a, b)
    assert not g.x_grad[pad].any() and not g.h_prev_grad[1].any()
    # batch 1 and T = 0
    one = block_lstm_proj(7, x[:, :1], h0[:1], c0[:1], w_ih, w_hh, b_ih, b_hh, w_hr)
    np.testing.assert_allclose(one.h[:, 0], block_lstm_proj(
        7, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr).h[:, 0], rtol=1e-12, atol=1e-14)
    empty = block_lstm_proj(0, x[:0], h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr)
    assert empty.h.shape == (0, 5, 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_bits_independent_of_threads(dtype):
    """1 and 2 threads give the same bits, forward and backward: float32's time loop
    splits each step's panels of H and P between threads, the GEMM driver (both
    precisions) rows or panels, never a sum."""
    T_, B_, I_, H_, P_ = 8, 32, 32, 256, 64
    assert _kernels.lstm_proj_step_threads_for(B_, H_, P_, 2) == 2   # the loop splits
    assert _kernels.lstm_proj_loop_threads_for(T_, B_, H_, P_, 2) == 2   # not short
    assert _kernels.lstm_proj_loop_threads_for(2, 16, 128, 64, 2) == 1   # a short call
    assert _kernels.lstm_proj_loop_threads_for(3, 16, 128, 96, 2) == 2   # 2.9M: not short
    assert _kernels.gates_by_rows_for(B_, 2)   # its gate math by rows, its products by cells
    args = [a * dtype(0.1) for a in _np_case(T_, B_, I_, H_, P_, dtype, seed=5)]
    lengths = np.array([8, 3, 7, 0] * 8)
    rng = np.random.default_rng(2)
    gh = rng.standard_normal((T_, B_, P_)).astype(dtype)
    gc = rng.standard_normal((T_, B_, H_)).astype(dtype)
    runs = []
    for n in (1, 2):
        with threadpool_limits(n, user_api="openmp"):
            out = block_lstm_proj(T_, *args, sequence_length=lengths)
            g = block_lstm_proj_grad(T_, *args, *out, gc, gh, sequence_length=lengths)
        runs.append(list(out) + list(g))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    if dtype == np.float32:   # and the values are right
        ref = block_lstm_proj(T_, *(a.astype(np.float64) for a in args),
                              sequence_length=lengths)
        np.testing.assert_allclose(runs[0][7], ref.h, rtol=1e-4, atol=1e-5)


_VARIANT_CHECK = r'''
import sys, numpy as np, blockrnn
from blockrnn.lstm_proj import block_lstm_proj, block_lstm_proj_grad
assert blockrnn._kernels.packed_kernel_name() == sys.argv[1]
rng = np.random.default_rng(0)
for T, B, I, H, P in [(5, 1, 7, 37, 5), (6, 13, 20, 40, 17), (4, 3, 0, 33, 32)]:
    r = lambda *s: rng.uniform(-0.5, 0.5, s)
    args = [r(T, B, I), r(B, P), r(B, H), r(4 * H, I), r(4 * H, P), r(4 * H), r(4 * H),
            r(P, H)]
    lens = rng.integers(0, T + 1, B)
    gh, gc = r(T, B, P), r(T, B, H)
    want = block_lstm_proj(T, *args, sequence_length=lens)
    want = list(want) + list(block_lstm_proj_grad(T, *args, *want, gc, gh, sequence_length=lens))
    a32 = [a.astype(np.float32) for a in args]
    got = block_lstm_proj(T, *a32, sequence_length=lens)
    got = list(got) + list(block_lstm_proj_grad(T, *a32, *got, gc.astype(np.float32),
                                                gh.astype(np.float32), sequence_length=lens))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
print("ok")
'''


@pytest.mark.parametrize("variant", ["avx512", "avx2", "portable"])
def test_every_kernel_variant(variant):
    """float32 forward and backward under each packed-kernel variant this CPU runs (in a
    subprocess: the variant is chosen at import) against float64; batch 1, H and P not
    multiples of 16, I = 0. A variant the CPU lacks is refused at import
    (tests/test_packed.py)."""
    check_kernel_variant(variant, _VARIANT_CHECK)


def test_float16_is_computed_in_float32():
    args = _np_case(5, 3, 4, 6, 2, np.float16, seed=7)
    out = block_lstm_proj(5, *args)
    ref = block_lstm_proj(5, *(a.astype(np.float32) for a in args))
    for a, b in zip(out, ref):
        assert a.dtype == np.float16
        np.testing.assert_array_equal(a, b.astype(np.float16))


def test_kernel_float32_matches_float64():
    args64 = _np_case(9, 6, 20, 24, 10, np.float64, seed=3)
    args32 = [a.astype(np.float32) for a in args64]
    o64, o32 = block_lstm_proj(9, *args64), block_lstm_proj(9, *args32)
    for a, b in zip(o32, o64):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    rng = np.random.default_rng(4)
    gh, gc = rng.standard_normal(o64.h.shape), rng.standard_normal(o64.cs.shape)
    g64 = block_lstm_proj_grad(9, *args64, *o64, gc, gh)
    g32 = block_lstm_proj_grad(9, *args32, *o32, gc.astype(np.float32), gh.astype(np.float32))
    for a, b in zip(g32, g64):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------
# The custom ops: gradcheck, opcheck, fresh outputs
# ---------------------------------------------------------------------------

def _op_cases():
    Tc, Bc, Ic, Hc, Pc = 4, 3, 3, 3, 2
    lengths = torch.tensor([4, 0, 2])
    x = _rand(Tc, Bc, Ic, seed=1)
    h0, c0 = _rand(Bc, Pc, seed=2), _rand(Bc, Hc, seed=3)
    w_ih, w_hh = _rand(4 * Hc, Ic, seed=4), _rand(4 * Hc, Pc, seed=5)
    b_ih, b_hh = _rand(4 * Hc, seed=6), _rand(4 * Hc, seed=7)
    w_hr = _rand(Pc, Hc, seed=8)
    cases = []
    for lens, rev in ((None, False), (lengths, True), (lengths, False)):
        tag = f"{'lengths' if lens is not None else 'full'}-{'rev' if rev else 'fwd'}"
        cases.append((f"bias-{tag}", (x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, lens, rev),
                      (0, 1, 2, 3, 4, 5, 6, 7)))
        cases.append((f"nobias-{tag}", (x, h0, c0, w_ih, w_hh, None, None, w_hr, lens, rev),
                      (0, 1, 2, 3, 4, 7)))
    return cases


CASES = _op_cases()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gradcheck_op(case):
    """float64 finite differences of (h, cs) w.r.t. every tensor input."""
    _, args, diff = case

    def f(*ts):
        a = list(args)
        for i, t in zip(diff, ts):
            a[i] = t
        return bt.lstm_proj_op(*a)[:2]

    assert torch.autograd.gradcheck(f, [args[i] for i in diff], eps=1e-6, atol=1e-8,
                                    rtol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_opcheck(case):
    """torch.library.opcheck on blockrnn::lstm_proj and blockrnn::lstm_proj_backward."""
    _, args, _ = case
    torch.library.opcheck(bt.lstm_proj_op, args)
    with torch.no_grad():
        out = bt.lstm_proj_op(*args)
    bargs = (*args, *out, _weights(out[0].shape, torch.float64),
             _weights(out[1].shape, torch.float64, seed=3))
    torch.library.opcheck(bt.lstm_proj_backward_op,
                          tuple(a.detach() if isinstance(a, torch.Tensor) else a
                                for a in bargs))


def test_op_outputs_are_fresh_and_double_backward_refused():
    for _, args, _ in CASES:
        with torch.no_grad():
            out = bt.lstm_proj_op(*args)
        ptrs = [t.untyped_storage().data_ptr() for t in out]
        ins = [a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)]
        assert len(set(ptrs)) == len(ptrs) and not set(ptrs) & set(ins)
    _, args, _ = CASES[0]
    h = bt.lstm_proj_op(*args)[0]
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(h.sum(), args[3], create_graph=True)


# ---------------------------------------------------------------------------
# torch.compile (fullgraph) and torch.export
# ---------------------------------------------------------------------------

class _Model(nn.Module):
    def __init__(self, **config):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(17, I)
        self.rnn = bt.LSTM(I, H, 2, proj_size=P, dropout=0.2, **config)
        self.out = nn.Linear((2 if self.rnn.bidirectional else 1) * P, 17)

    def forward(self, tokens, lengths):
        y, hidden = self.rnn(self.emb(tokens), None, sequence_length=lengths)
        return self.out(y), hidden


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_compile_fullgraph_forward_and_backward(bidirectional):
    """torch.compile(fullgraph=True) traces Embedding -> projected LSTM -> Linear with no
    graph break; outputs and gradients equal eager."""
    torch._dynamo.reset()
    model = _Model(bidirectional=bidirectional).double().eval()
    tokens = torch.randint(0, 17, (T, B), generator=torch.Generator().manual_seed(5))
    lengths = torch.tensor(LENGTHS)
    compiled = torch.compile(model, fullgraph=True)
    results = []
    for m in (compiled, model):
        model.zero_grad()
        y, hidden = m(tokens, lengths)
        _loss(y, hidden).backward()
        results.append((y.detach(), [h.detach() for h in hidden],
                        [p.grad.clone() for p in model.parameters()]))
    (y1, h1, g1), (y0, h0, g0) = results
    torch.testing.assert_close(y1, y0, rtol=1e-12, atol=1e-12)
    for a, b in zip(h1 + g1, h0 + g0):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_compile_fullgraph_packed_sequence_input():
    """An unsorted PackedSequence through a compiled 2-layer bidirectional projected LSTM:
    no graph break; outputs and the input gradient equal eager and nn.LSTM's."""
    torch._dynamo.reset()
    ref, ours = _pair(num_layers=2, bidirectional=True)
    x = _rand(T, B, I, seed=1)

    def f(module, pk):
        y, (h, c) = module(pk)
        return y.data, h, c

    compiled = torch.compile(lambda pk: f(ours, pk), fullgraph=True)
    results = []
    for fn in (compiled, lambda pk: f(ours, pk), lambda pk: f(ref, pk)):
        x.grad = None
        outs = fn(pack_padded_sequence(x, torch.tensor(LENGTHS), enforce_sorted=False))
        _loss(outs[0], outs[1:]).backward()
        results.append([o.detach() for o in outs] + [x.grad.clone()])
    for a, b, c in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-10)


def test_export_runs_and_equals_eager():
    model = _Model(bidirectional=True).double().eval()
    tokens = torch.randint(0, 17, (T, B), generator=torch.Generator().manual_seed(5))
    lengths = torch.tensor(LENGTHS)
    program = torch.export.export(model, (tokens, lengths))
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert any("lstm_proj" in t for t in targets)
    other = torch.randint(0, 17, (T, B), generator=torch.Generator().manual_seed(6))
    for tok in (tokens, other):
        y, hidden = program.module()(tok, lengths)
        with torch.no_grad():
            y0, hidden0 = model(tok, lengths)
        torch.testing.assert_close(y, y0, rtol=0, atol=0)
        for a, b in zip(hidden, hidden0):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------

def test_bad_input():
    x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr = _np_case(T, B, I, H, P, np.float64)
    with pytest.raises(ValueError, match=r"w_hh must have shape \[4H, P\] = \(16, 3\)"):
        block_lstm_proj(T, x, h0, c0, w_ih, w_hh[:, :2], b_ih, b_hh, w_hr)
    with pytest.raises(ValueError, match=r"w_hr must have shape \[P, H\] = \(2, 4\)"):
        block_lstm_proj(T, x, h0[:, :2], c0, w_ih, w_hh, b_ih, b_hh, w_hr)
    with pytest.raises(ValueError, match=r"h_prev must have shape \[B, P\] = \(4, 3\)"):
        block_lstm_proj(T, x, h0[:2], c0, w_ih, w_hh, b_ih, b_hh, w_hr)
    with pytest.raises(ValueError, match=r"w_hr must have shape \[P, H\] = \(3, 4\), got "
                                         r"\(4,\)"):
        block_lstm_proj(T, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr[0])
    with pytest.raises(ValueError, match=r"w_hr must have shape \[P, H\] = \(3, 4\), got "
                                         r"\(3, 5\)"):
        block_lstm_proj(T, x, h0, c0, w_ih, w_hh, b_ih, b_hh, np.zeros((P, H + 1)))
    with pytest.raises(ValueError, match="P .* must be >= 1"):
        block_lstm_proj(T, x, h0[:, :0], c0, w_ih, w_hh[:, :0], b_ih, b_hh, w_hr[:0])
    with pytest.raises(ValueError, match="seq_len_max"):
        block_lstm_proj(T + 1, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr)
    out = block_lstm_proj(T, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr)
    with pytest.raises(ValueError, match=r"h_grad must have shape \[T, B, P\]"):
        block_lstm_proj_grad(T, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, *out, out.cs, out.cs)
    with pytest.raises(TypeError, match="dtype"):
        block_lstm_proj(T, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr.astype(np.float32))
    # the module
    with pytest.raises(ValueError, match="proj_size has to be smaller than hidden_size"):
        bt.LSTM(I, H, proj_size=H)
    with pytest.raises(ValueError, match="proj_size should be a positive integer"):
        bt.LSTM(I, H, proj_size=-1)
    with pytest.raises(TypeError, match="proj_size must be an int"):
        bt.LSTM(I, H, proj_size=1.5)
    for extra in (dict(use_peephole=True), dict(cell_clip=1.0), dict(forget_bias=1.0)):
        with pytest.raises(ValueError, match="proj_size=3 cannot be combined with "
                                             "use_peephole, cell_clip or forget_bias"):
            bt.LSTM(I, H, proj_size=P, **extra)
    ours = bt.LSTM(I, H, proj_size=P, dtype=torch.float64)
    xt = torch.zeros(T, B, I, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"h0 must have shape \(1, 4, 3\)"):
        ours(xt, (torch.zeros(1, B, H, dtype=torch.float64),
                  torch.zeros(1, B, H, dtype=torch.float64)))
    with pytest.raises(ValueError, match=r"c0 must have shape \(1, 4, 4\)"):
        ours(xt, (torch.zeros(1, B, P, dtype=torch.float64),
                  torch.zeros(1, B, P, dtype=torch.float64)))
    sd = ours.state_dict()
    sd["weight_hr_l0"] = torch.zeros(P, H + 1, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="weight_hr_l0"):
        ours.load_state_dict(sd)
    with pytest.raises(RuntimeError, match="weight_hr_l0"):   # a non-projected checkpoint
        ours.load_state_dict(nn.LSTM(I, H, dtype=torch.float64).state_dict())
    with pytest.raises(ValueError, match=r"w_hr must have shape \[P, H\] = \(3, 4\)"):
        bt.lstm_proj_op(xt, torch.zeros(B, P, dtype=torch.float64),
                        torch.zeros(B, H, dtype=torch.float64), *(
                            p.detach() for p in (ours.weight_ih_l0, ours.weight_hh_l0,
                                                 ours.bias_ih_l0, ours.bias_hh_l0)),
                        torch.zeros(P, H + 1, dtype=torch.float64), None, False)
    # blockrnn's NumPy layers have no projection: convert keeps refusing, naming proj_size
    with pytest.raises(ValueError, match="proj_size"):
        convert.from_torch(nn.LSTM(I, H, proj_size=P))
    with pytest.raises(ValueError, match="no projected LSTM; the module has proj_size=3"):
        bt.upgrade_state_dict_v01({}, ours)

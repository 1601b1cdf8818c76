"""blockrnn.torch.LSTM / GRU as drop-ins for torch.nn.LSTM / nn.GRU (issue 27).

The same parameters (names, shapes, order, initialisation, state_dict both ways, strict),
the same training (SGD with weight decay and gradient clipping, step by step), the same
outputs, states and gradients (float64 and float32, padded and unsorted PackedSequence);
the custom ops under gradcheck, torch.library.opcheck, torch.compile(fullgraph=True) and
torch.export. PyTorch is required: a missing torch FAILS these tests.
"""
import itertools
import re

import numpy as np
import pytest

try:
    import torch
    from torch import nn
    from torch.autograd import forward_ad
    from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence
except ImportError as exc:  # pragma: no cover - depends on the environment
    pytest.fail(f"PyTorch is required for the blockrnn.torch tests ({exc!r}); install the "
                f"test extras with `pip install -e .[test]`", pytrace=False)

import blockrnn.torch as bt

T, B, I, H = 6, 4, 5, 3
LENGTHS = [6, 1, 4, 3]          # unsorted, with a length-1 row
NN = {"lstm": nn.LSTM, "gru": nn.GRU}
OURS = {"lstm": bt.LSTM, "gru": bt.GRU}


def _rand(*shape, dtype=torch.float64, seed=0, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(*shape, generator=g, dtype=dtype) * 2 - 1
    return t.requires_grad_(requires_grad)


def _weights(shape, dtype, seed=11):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _pair(kind, dtype=torch.float64, seed=0, **config):
    """(nn module, blockrnn module) built from the same seed: identical parameters."""
    torch.manual_seed(seed)
    ref = NN[kind](I, H, **config, dtype=dtype)
    torch.manual_seed(seed)
    ours = OURS[kind](I, H, **config, dtype=dtype)
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
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_parameters_and_state_dict_both_ways(kind, config):
    """Names, shapes, order, count and initial values equal nn's (built from the same
    seed); a state_dict moves strictly both ways and the outputs then agree."""
    ref, ours = _pair(kind, **config)
    assert [(n, p.shape) for n, p in ours.named_parameters()] == \
        [(n, p.shape) for n, p in ref.named_parameters()]
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())
    for (n, p), (_, q) in zip(ours.named_parameters(), ref.named_parameters()):
        assert torch.equal(p, q), n                        # nn's initialisation, bit for bit
    assert list(ours.state_dict()) == list(ref.state_dict())
    # nn -> ours and ours -> nn, strict, with fresh random values.
    torch.manual_seed(1)
    src = NN[kind](I, H, **config, dtype=torch.float64)
    ours.load_state_dict(src.state_dict(), strict=True)
    back = NN[kind](I, H, **config, dtype=torch.float64)
    back.load_state_dict(ours.state_dict(), strict=True)
    for (n, p), (_, q), (_, r) in zip(src.named_parameters(), ours.named_parameters(),
                                      back.named_parameters()):
        assert torch.equal(p, q) and torch.equal(p, r), n
    x = _rand(*((B, T, I) if config["batch_first"] else (T, B, I)), requires_grad=False)
    with torch.no_grad():
        y, s = ours(x)
        y_ref, s_ref = src(x)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(s if kind == "lstm" else (s,), s_ref if kind == "lstm" else (s_ref,)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # from_torch copies the configuration and the state_dict.
    conv = OURS[kind].from_torch(src)
    assert all(torch.equal(p, q) for p, q in zip(conv.parameters(), src.parameters()))
    assert (conv.num_layers, conv.bidirectional, conv.bias, conv.batch_first) == \
        (src.num_layers, src.bidirectional, src.bias, src.batch_first)


def test_extras_only_when_asked_for():
    assert [n for n, _ in bt.LSTM(I, H, use_peephole=True).named_parameters()][-3:] == \
        ["weight_ci_l0", "weight_cf_l0", "weight_co_l0"]
    plain = bt.LSTM(I, H, cell_clip=1.0, forget_bias=1.0)
    assert [n for n, _ in plain.named_parameters()] == \
        [n for n, _ in nn.LSTM(I, H).named_parameters()]
    assert not list(plain.buffers())
    assert "forget_bias=1.0" in repr(plain) and "reset_after=False" in \
        repr(bt.GRU(I, H, reset_after=False))
    assert [n for n, _ in bt.LSTM(I, H, proj_size=2).named_parameters()] == \
        [n for n, _ in nn.LSTM(I, H, proj_size=2).named_parameters()]


RNNBASE_CASES = [("lstm", {}), ("lstm", dict(num_layers=2, bidirectional=True)),
                 ("lstm", dict(bias=False)), ("lstm", dict(num_layers=2, proj_size=2)),
                 ("gru", {}), ("gru", dict(num_layers=2, bidirectional=True)),
                 ("gru", dict(bias=False))]


@pytest.mark.parametrize("kind,config", RNNBASE_CASES,
                         ids=[f"{k}-{'-'.join(map(str, c.values())) or 'plain'}"
                              for k, c in RNNBASE_CASES])
def test_rnnbase_attributes_code_for_nn_uses(kind, config):
    """What code written for nn.LSTM / nn.GRU touches besides the parameters:
    all_weights, _all_weights, _flat_weights_names, _flat_weights (read-only), mode,
    proj_size, and flatten_parameters() (a no-op, as nn's on CPU)."""
    ref, ours = _pair(kind, **config)
    assert ours._all_weights == ref._all_weights
    assert ours._flat_weights_names == ref._flat_weights_names
    assert [p.shape for p in ours._flat_weights] == [p.shape for p in ref._flat_weights]
    assert all(p is getattr(ours, n) for n, p in zip(ours._flat_weights_names,
                                                     ours._flat_weights))
    with pytest.raises(AttributeError):
        ours._flat_weights = list(ref._flat_weights)   # ignored if allowed: refused
    assert (ours.mode, ours.proj_size) == (ref.mode, ref.proj_size)
    assert [[p.shape for p in ps] for ps in ours.all_weights] == \
        [[p.shape for p in ps] for ps in ref.all_weights]
    named = dict(ours.named_parameters())
    assert all(p is named[n] for names, ps in zip(ours._all_weights, ours.all_weights)
               for n, p in zip(names, ps))
    before = [p.detach().clone() for p in ours.parameters()]
    assert ours.flatten_parameters() is None
    assert all(torch.equal(a, b) for a, b in zip(before, ours.parameters()))
    # blockrnn's extras are listed too, in registration order.
    for extra in (bt.LSTM(I, H, use_peephole=True), bt.GRU(I, H, reset_after=False)):
        assert extra._flat_weights_names == [n for n, _ in extra.named_parameters()]


def _outcome(fn, *args):
    """fn(*args)'s value, or its exception's type and message."""
    try:
        return fn(*args)
    except Exception as exc:   # compared between nn and blockrnn
        return type(exc), str(exc)


@pytest.mark.parametrize("kind,config", RNNBASE_CASES,
                         ids=[f"{k}-{'-'.join(map(str, c.values())) or 'plain'}"
                              for k, c in RNNBASE_CASES])
def test_rnnbase_argument_checks_are_nns(kind, config):
    """nn.RNNBase's public checks, which a subclass's forward written for nn.LSTM calls
    (check_input, get_expected_hidden_size / cell_size, check_hidden_size,
    check_forward_args, permute_hidden): nn's values, and nn's exceptions and messages,
    on valid and invalid arguments; then such a forward end to end."""
    ref, ours = _pair(kind, **config)
    LD, P = ref.num_layers * (2 if ref.bidirectional else 1), ref.proj_size or H
    x = _rand(B, T, I) if ref.batch_first else _rand(T, B, I)
    packed = pack_padded_sequence(x, LENGTHS, batch_first=ref.batch_first,
                                  enforce_sorted=False)
    good_h, good_c = _rand(LD, B, P), _rand(LD, B, H)
    hidden = (good_h, good_c) if kind == "lstm" else good_h
    inputs = [(x, None), (packed.data, packed.batch_sizes),         # valid
              (x.float(), None), (x[0], None), (x[..., :-1], None)]  # dtype, dims, size
    for inp, sizes in inputs:
        for name in ("check_input", "get_expected_hidden_size"):
            assert _outcome(getattr(ours, name), inp, sizes) == \
                _outcome(getattr(ref, name), inp, sizes), (name, inp.shape)
        for h in (hidden, (good_h[:, :1], good_c) if kind == "lstm" else good_h[:1],
                  (good_h, good_c[..., :1]) if kind == "lstm" else good_h[..., :1]):
            assert _outcome(ours.check_forward_args, inp, h, sizes) == \
                _outcome(ref.check_forward_args, inp, h, sizes)
    if kind == "lstm":
        assert ours.get_expected_cell_size(x, None) == ref.get_expected_cell_size(x, None)
    assert _outcome(ours.check_hidden_size, good_h, (1, 2, 3)) == \
        _outcome(ref.check_hidden_size, good_h, (1, 2, 3))
    perm = packed.sorted_indices
    for got, want in zip(ours.permute_hidden(hidden, perm) if kind == "lstm"
                         else (ours.permute_hidden(hidden, perm),),
                         ref.permute_hidden(hidden, perm) if kind == "lstm"
                         else (ref.permute_hidden(hidden, perm),)):
        assert torch.equal(got, want)
    assert ours.permute_hidden(hidden, None) is hidden

    class Checked(type(ours)):     # a subclass written for nn: checks, then super()
        def forward(self, x, hx):
            self.check_forward_args(x, hx, None)
            return super().forward(x, hx)
    checked = Checked(I, H, **config, dtype=torch.float64)
    checked.load_state_dict(ours.state_dict())
    y, _ = checked(x, hidden)
    assert torch.equal(y, ours(x, hidden)[0])
    with pytest.raises(RuntimeError, match="Expected hidden"):
        checked(x, (good_h[:, :1], good_c) if kind == "lstm" else good_h[:, :1])


def test_forget_gate_bias_recipe_written_for_nn_lstm():
    """The common recipe that walks nn.LSTM._all_weights to set the forget gate's bias
    to 1 sets the same entries here; the outputs then agree with nn.LSTM's."""
    ref, ours = _pair("lstm", num_layers=2)
    for m in (ref, ours):
        m.flatten_parameters()
        for names in m._all_weights:
            for name in filter(lambda n: "bias" in n, names):
                bias = getattr(m, name)
                n = bias.size(0)
                bias.data[n // 4:n // 2].fill_(1.0)
    for (n, p), (_, q) in zip(ours.named_parameters(), ref.named_parameters()):
        assert torch.equal(p, q), n
    assert float(ours.bias_ih_l1.detach()[H:2 * H].min()) == 1.0
    x = _rand(T, B, I, requires_grad=False)
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], ref(x)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_cpu_autocast_runs_in_float32(kind, dtype):
    """Under torch.autocast("cpu") the layer before hands the module bfloat16 / float16: it
    runs in float32, as autocast's float32 ops (nn.LSTM runs in the low precision), with the
    bits of the same call on the input cast by hand -- outputs, states, the gradient to the
    low-precision input, the no-grad path, a PackedSequence, low-precision initial states.
    Outside autocast such an input is refused as before."""
    torch.manual_seed(0)
    lin = nn.Linear(I, I)
    ours = OURS[kind](I, H, num_layers=2, bidirectional=True, dtype=torch.float32)
    x = _rand(T, B, I, dtype=torch.float32, requires_grad=False)
    state = tuple(_rand(4, B, H, dtype=dtype, seed=s, requires_grad=False) for s in (3, 4))
    state = state if kind == "lstm" else state[0]
    with torch.autocast("cpu", dtype=dtype):
        h = lin(x)
        assert h.dtype == dtype
        y, s = ours(h, state)
        (g,) = torch.autograd.grad(y.sum(), h)
        with torch.no_grad():
            y_nograd, _ = ours(h, state)
        packed = pack_padded_sequence(h, LENGTHS, enforce_sorted=False)
        y_packed, _ = ours(packed)
    h32 = h.detach().float().requires_grad_()
    state32 = tuple(t.float() for t in state) if kind == "lstm" else state.float()
    y_ref, s_ref = ours(h32, state32)
    (g_ref,) = torch.autograd.grad(y_ref.sum(), h32)
    assert y.dtype == torch.float32 and torch.equal(y, y_ref)
    for a, b in zip(s if kind == "lstm" else (s,), s_ref if kind == "lstm" else (s_ref,)):
        assert torch.equal(a, b)
    assert g.dtype == dtype and torch.equal(g, g_ref.to(dtype))
    assert torch.equal(y_nograd, y_ref.detach())
    want = ours(pack_padded_sequence(h32.detach(), LENGTHS, enforce_sorted=False))[0]
    assert y_packed.data.dtype == torch.float32 and torch.equal(y_packed.data, want.data)
    with pytest.raises(TypeError, match="input has dtype torch.(bfloat|float)16 but the "
                                        "parameters have torch.float32"):
        ours(h.detach())


LOW_PRECISION_CASES = {   # module constructor arguments (beyond I, H) of each case
    "lstm": dict(num_layers=2, bidirectional=True),
    "lstm_proj": dict(num_layers=2, proj_size=2),
    "gru": dict(num_layers=2, bidirectional=True),
    "gru_block": dict(reset_after=False),
}


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", list(LOW_PRECISION_CASES))
def test_low_precision_module_computes_in_float32(case, dtype):
    """A bfloat16 / float16 module (module.to(dtype), .half(), dtype=...: nn.LSTM runs
    them) computes in float32: its outputs, final states and gradients (of its dtype)
    are the float32 module's on the same values, rounded once -- bit for bit, grad and
    no-grad paths, lengths; close to nn's own low-precision module; an optimizer step
    is seen by the no-grad path; an input of another dtype raises."""
    kind = case.split("_")[0]
    config = LOW_PRECISION_CASES[case]
    torch.manual_seed(0)
    low = OURS[kind](I, H, **config, dtype=dtype)
    assert all(p.dtype == dtype for p in low.parameters())
    ref = OURS[kind](I, H, **config)                    # float32, the same values
    ref.load_state_dict({n: p.float() for n, p in low.state_dict().items()})
    P = config.get("proj_size") or H
    D = 2 if config.get("bidirectional") else 1
    LD = config.get("num_layers", 1) * D
    x = _rand(T, B, I, dtype=dtype)
    h0 = _rand(LD, B, P, dtype=dtype, seed=1, requires_grad=False)
    c0 = _rand(LD, B, H, dtype=dtype, seed=2, requires_grad=False)
    state = (h0, c0) if kind == "lstm" else h0
    state32 = (h0.float(), c0.float()) if kind == "lstm" else h0.float()
    flat = (lambda s: s) if kind == "lstm" else (lambda s: (s,))
    w = _rand(T, B, D * P, dtype=dtype, seed=3, requires_grad=False).float()  # exact in dtype
    for lengths in (None, LENGTHS):
        y, s = low(x, state, sequence_length=lengths)
        x32 = x.detach().float().requires_grad_()
        y_ref, s_ref = ref(x32, state32, sequence_length=lengths)
        assert y.dtype == dtype and torch.equal(y, y_ref.to(dtype))
        for a, b in zip(flat(s), flat(s_ref)):
            assert a.dtype == dtype and torch.equal(a, b.to(dtype))
        low.zero_grad(), ref.zero_grad()
        x.grad = None
        (y.float() * w).sum().backward()
        (y_ref * w).sum().backward()
        assert x.grad.dtype == dtype and torch.equal(x.grad, x32.grad.to(dtype))
        for (n, p), q in zip(low.named_parameters(), ref.parameters()):
            assert p.grad.dtype == dtype and torch.equal(p.grad, q.grad.to(dtype)), n
        with torch.no_grad():
            y_ng, s_ng = low(x, state, sequence_length=lengths)
        assert y_ng.dtype == dtype and torch.equal(y_ng, y_ref.detach().to(dtype))
    # nn's own low-precision module (it rounds at every step: close, not equal)
    if case != "gru_block":
        theirs = NN[kind](I, H, **config, dtype=dtype)
        theirs.load_state_dict(low.state_dict())
        y_nn, _ = theirs(x.detach(), state)
        y, _ = low(x.detach(), state)
        tol = 0.05 if dtype == torch.bfloat16 else 5e-3
        torch.testing.assert_close(y.detach().float(), y_nn.float(), rtol=0, atol=tol)
    # an optimizer step on the low-precision parameters reaches the no-grad path
    with torch.no_grad():
        low(x, state)
    packings = low.inference_cache_info()["packings"]
    torch.optim.SGD(low.parameters(), lr=0.5).step()
    ref.load_state_dict({n: p.float() for n, p in low.state_dict().items()})
    with torch.no_grad():
        y_ng = low(x, state)[0]
        assert torch.equal(y_ng, ref(x.float(), state32)[0].to(dtype))
    if case != "lstm_proj":    # (proj_size has no inference path)
        assert low.inference_cache_info()["packings"] > packings
    with pytest.raises(TypeError, match=f"input has dtype torch.float32 but the parameters "
                                        f"have {dtype}"):
        low(x.detach().float())
    with torch.autocast("cpu", dtype=dtype):    # there a float32 input runs in dtype, as nn's
        y_auto, _ = low(x.detach().float(), state)
    assert y_auto.dtype == dtype and torch.equal(y_auto, low(x.detach(), state)[0])


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_forward_mode_ad_is_refused(kind):   # (torch.func.jacfwd's own jit.script warns)
    """blockrnn's ops have no JVP rule, and under torch.func.jvp PyTorch runs a custom op
    as a constant: the tangents came back zero. Every forward-mode entry now raises: the
    module under torch.func.jvp (grad mode on or off) and jacfwd, a dual tensor of
    torch.autograd.forward_ad as input (grad path and no-grad path), state or weight,
    an op called with one. Within an open dual level, a call with nothing dual runs."""
    _, ours = _pair(kind)
    x = _rand(T, B, I, requires_grad=False)
    v = torch.ones_like(x)
    refused = pytest.raises(RuntimeError, match="forward-mode AD .* is not supported")
    with refused:
        torch.func.jvp(lambda a: ours(a)[0], (x,), (v,))
    with refused, torch.no_grad():
        torch.func.jvp(lambda a: ours(a)[0], (x,), (v,))
    with refused:
        torch.func.jacfwd(lambda a: ours(a)[0].sum())(x)
    fast = OURS[kind](I, H).requires_grad_(False)       # float32: the packed no-grad path
    h0 = torch.zeros(1, B, H, dtype=torch.float64)
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(x, v)
        with refused:
            ours(dual)
        with refused:
            fast(forward_ad.make_dual(x.float(), v.float()))
        with refused:
            state = forward_ad.make_dual(h0, torch.ones_like(h0))
            ours(x, (state, h0) if kind == "lstm" else state)
        name, p = next(iter(ours.named_parameters()))
        with refused:
            torch.func.functional_call(
                ours, {name: forward_ad.make_dual(p.detach(), torch.ones_like(p))}, (x,))
        ps = [None if t is None else t.detach() for t in ours._cell_params("_l0")]
        with refused:
            if kind == "lstm":
                bt.lstm_op(dual, h0[0], h0[0], *ps, None, 0.0, 0.0, False)
            else:
                bt.gru_op(dual, h0[0], *ps, None, False)
        y, _ = ours(x)                                    # nothing dual
        assert forward_ad.unpack_dual(y).tangent is None


# torch.func: grad, vjp, jacrev and vmap run (the ops' own Functions there); what
# needs a second derivative raises.
FUNC_CASES = [("lstm", {}, True), ("lstm", dict(num_layers=2, bidirectional=True,
                                                batch_first=True), False),
              ("lstm", dict(proj_size=2), True), ("lstm", dict(use_peephole=True), False),
              ("gru", dict(num_layers=2, bidirectional=True, bias=False), True),
              ("gru", dict(reset_after=False), False)]
FUNC_IDS = [f"{k}-{'-'.join(map(str, c.values())) or 'plain'}-{'lengths' if n else 'full'}"
            for k, c, n in FUNC_CASES]


def _func_module(kind, config, dtype=torch.float64):
    torch.manual_seed(0)
    return OURS[kind](I, H, **config, dtype=dtype)


def _func_loss(module, lengths):
    """loss(params, x) of the module's output and final states, for torch.func."""
    def loss(params, x):
        kwargs = {} if lengths is None else {"sequence_length": lengths}   # (nn has none)
        y, s = torch.func.functional_call(module, params, (x,), kwargs)
        return _loss(y, s if isinstance(s, tuple) else (s,))
    return loss


@pytest.mark.parametrize("kind,config,with_lengths", FUNC_CASES, ids=FUNC_IDS)
def test_torch_func_grad_vjp_jacrev_equal_autograd(kind, config, with_lengths):
    """torch.func.grad (of the parameters and x), vjp and jacrev give, bit for bit, the
    gradients .backward() gives (torch 2.13's custom_op autograd refuses torch.func:
    these raised "must override the setup_context staticmethod"), and nn's where nn
    has the configuration."""
    ours = _func_module(kind, config)
    lengths = torch.tensor(LENGTHS) if with_lengths else None
    shape = (B, T, I) if config.get("batch_first") else (T, B, I)
    x = _rand(*shape, seed=1, requires_grad=False)
    loss = _func_loss(ours, lengths)
    params = {n: p.detach() for n, p in ours.named_parameters()}
    g_params, g_x = torch.func.grad(loss, argnums=(0, 1))(params, x)
    x_ad = x.clone().requires_grad_(True)
    loss(dict(ours.named_parameters()), x_ad).backward()
    assert torch.equal(g_x, x_ad.grad)
    for n, p in ours.named_parameters():
        assert torch.equal(g_params[n], p.grad), n
    f = lambda a: ours(a, sequence_length=lengths)[0]            # noqa: E731
    cot = _weights(f(x).shape, x.dtype, seed=3)
    y, vjp_fn = torch.func.vjp(f, x)
    (g_vjp,) = vjp_fn(cot)
    assert torch.equal(y, f(x))
    assert torch.equal(g_vjp, torch.autograd.grad(f(x_ad), x_ad, cot)[0])
    with pytest.raises(RuntimeError, match="not differentiable"):
        g_vjp.sum().backward()      # vjp_fn ran in grad mode: its result has a graph
    jac = torch.func.jacrev(f)(x)
    assert jac.shape == (*y.shape, *x.shape)
    torch.testing.assert_close((jac * cot[(...,) + (None,) * x.ndim]).sum(tuple(range(y.ndim))),
                               g_vjp.detach(), rtol=1e-12, atol=1e-14)
    if kind in NN and not set(config) - {"num_layers", "bidirectional", "batch_first", "bias",
                                        "proj_size"} and lengths is None:
        torch.manual_seed(0)
        ref = NN[kind](I, H, **config, dtype=torch.float64)
        torch.testing.assert_close(torch.func.jacrev(lambda a: ref(a)[0])(x), jac,
                                   rtol=1e-10, atol=1e-12)
        g_ref = torch.func.grad(_func_loss(ref, None))(
            {n: p.detach() for n, p in ref.named_parameters()}, x)
        for n in g_ref:
            torch.testing.assert_close(g_params[n], g_ref[n], rtol=1e-10, atol=1e-12, msg=n)


@pytest.mark.parametrize("kind,config,with_lengths", FUNC_CASES, ids=FUNC_IDS)
def test_vmap_runs_each_sample_as_its_own_call(kind, config, with_lengths):
    """torch.func.vmap over the module (no_grad: it raised "Cannot access data pointer"
    on the packed no-grad path) and vmap(grad) (per-sample gradients) equal the
    samples' own calls bit for bit, float32 (the samples' no-grad calls run the packed
    path), x and the initial state batched."""
    ours = _func_module(kind, config, torch.float32)
    lengths = torch.tensor(LENGTHS) if with_lengths else None
    V = 3
    shape = (B, T, I) if config.get("batch_first") else (T, B, I)
    xs = _rand(V, *shape, dtype=torch.float32, seed=1, requires_grad=False)
    D = 2 if config.get("bidirectional") else 1
    h0s = _rand(V, config.get("num_layers", 1) * D, B, config.get("proj_size") or H,
                dtype=torch.float32, seed=2, requires_grad=False)

    def f(a, h):
        state = (h, torch.zeros(h.shape[0], B, H)) if kind == "lstm" else h
        return ours(a, state, sequence_length=lengths)[0]
    for grad_mode in (False, True):
        with torch.set_grad_enabled(grad_mode):
            batched = torch.func.vmap(f)(xs, h0s)
            for v in range(V):
                assert torch.equal(batched[v], f(xs[v], h0s[v]).detach()), (grad_mode, v)
    with pytest.raises(ValueError, match="vmap over a dimension of size 0"):
        torch.func.vmap(f)(xs[:0], h0s[:0])

    def loss(params, a):      # (no random weights: vmap refuses random ops)
        return torch.func.functional_call(ours, params, (a,),
                                          {"sequence_length": lengths})[0].pow(2).sum()
    params = {n: p.detach() for n, p in ours.named_parameters()}
    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, xs)
    for v in range(V):
        ours.zero_grad()
        loss(dict(ours.named_parameters()), xs[v]).backward()
        for n, p in ours.named_parameters():
            assert torch.equal(per_sample[n][v], p.grad), (n, v)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_vmap_over_stacked_models(kind):
    """Model ensembling as torch.func documents it: the parameters of 3 models stacked
    (stack_module_state), vmap over them with functional_call on a meta copy: each
    model's own output, bit for bit."""
    torch.manual_seed(0)
    models = [OURS[kind](I, H, num_layers=2, dtype=torch.float64) for _ in range(3)]
    params, buffers = torch.func.stack_module_state(models)
    base = OURS[kind](I, H, num_layers=2, dtype=torch.float64, device="meta")
    x = _rand(T, B, I, seed=1, requires_grad=False)
    out = torch.func.vmap(lambda p, b: torch.func.functional_call(base, (p, b), (x,))[0])(
        params, buffers)
    for m, y in zip(models, out):
        assert torch.equal(y, m(x)[0])


@pytest.mark.parametrize("kind,config,with_lengths", FUNC_CASES, ids=FUNC_IDS)
def test_batched_grads_of_torch_autograd(kind, config, with_lengths):
    """torch.autograd.grad(..., is_grads_batched=True) (what
    torch.autograd.functional.jacobian(vectorize=True) runs) equals one call per
    gradient, bit for bit: its vmap is not torch.func's, and the backward read the
    batched gradient's data ("Batching rule not implemented for aten::detach")."""
    ours = _func_module(kind, config)
    lengths = torch.tensor(LENGTHS) if with_lengths else None
    shape = (B, T, I) if config.get("batch_first") else (T, B, I)
    x = _rand(*shape, seed=1)
    y = ours(x, sequence_length=lengths)[0]
    cots = _weights((3, *y.shape), y.dtype, seed=4)
    (batched,) = torch.autograd.grad(y, x, cots, is_grads_batched=True, retain_graph=True)
    for v in range(3):
        assert torch.equal(batched[v], torch.autograd.grad(y, x, cots[v], retain_graph=True)[0])
    if kind in NN and set(config) <= {"num_layers", "bidirectional", "batch_first"}:
        torch.manual_seed(0)
        ref = NN[kind](I, H, **config, dtype=torch.float64)
        f = lambda m: lambda a: m(a)[0]                                 # noqa: E731
        x0 = x.detach()
        torch.testing.assert_close(
            torch.autograd.functional.jacobian(f(ours), x0, vectorize=True),
            torch.autograd.functional.jacobian(f(ref), x0), rtol=1e-10, atol=1e-12)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_torch_func_second_derivatives_raise(kind):
    """grad(grad), jacrev(jacrev) and hessian need the gradient's own derivative:
    a clear RuntimeError (the first derivatives above run)."""
    ours = _func_module(kind, {})
    x = _rand(T, B, I, seed=1, requires_grad=False)
    f = lambda a: ours(a)[0].pow(2).sum()                          # noqa: E731
    with pytest.raises(RuntimeError, match="not differentiable"):
        torch.func.grad(lambda a: torch.func.grad(f)(a).sum())(x)
    with pytest.raises(RuntimeError, match="not differentiable"):
        torch.func.jacrev(torch.func.jacrev(f))(x)
    with pytest.raises(RuntimeError, match="forward-mode AD .* is not supported"):
        torch.func.hessian(f)(x)


META_CASES = [("lstm", {}), ("lstm", dict(num_layers=2, bidirectional=True,
                                          batch_first=True)),
              ("lstm", dict(proj_size=2, num_layers=2)), ("gru", dict(bias=False)),
              ("gru", dict(num_layers=2, bidirectional=True))]


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
@pytest.mark.parametrize("kind,config", META_CASES,
                         ids=[f"{k}-{'-'.join(map(str, c.values())) or 'plain'}"
                              for k, c in META_CASES])
def test_meta_device_gives_nn_shapes(kind, config):
    """On the meta device (device="meta" or torch.device("meta") as a context: shapes
    only, what model-size tools and deferred initialisation use) a forward, with
    sequence_length too, gives nn's shapes and device, grad mode and no_grad, and a
    backward gives meta gradients; then to_empty + load_state_dict computes. It raised
    "runs on the CPU only". Mixed devices raise as nn does; a meta PackedSequence
    raises (its lengths are values)."""
    ref = NN[kind](I, H, **config, device="meta")
    with torch.device("meta"):
        ours = OURS[kind](I, H, **config)
    assert all(p.is_meta for p in ours.parameters())
    assert all(p.is_meta for p in OURS[kind](I, H, **config, device="meta").parameters())
    x = torch.randn(*((B, T, I) if config.get("batch_first") else (T, B, I)), device="meta",
                    requires_grad=True)
    y_ref, s_ref = ref(x)
    for kwargs in ({}, {"sequence_length": LENGTHS}):
        y, s = ours(x, **kwargs)
        assert y.is_meta and y.shape == y_ref.shape
        states, states_ref = (s, s_ref) if kind == "lstm" else ((s,), (s_ref,))
        assert [(t.shape, t.device) for t in states] == \
            [(t.shape, t.device) for t in states_ref]
        with torch.no_grad():
            assert ours(x, **kwargs)[0].shape == y_ref.shape
    (y.sum() + sum(t.sum() for t in states)).backward()
    assert x.grad.is_meta and x.grad.shape == x.shape
    assert all(p.grad.is_meta and p.grad.shape == p.shape for p in ours.parameters())
    unbatched = x[0] if config.get("batch_first") else x[:, 0]      # (T, I)
    assert ours(unbatched)[0].shape == ref(unbatched)[0].shape
    with pytest.raises(ValueError, match="input is on cpu but the parameters are on meta"):
        ours(torch.randn(x.shape))
    with pytest.raises(ValueError, match="input is on meta but the parameters are on cpu"):
        OURS[kind](I, H, **config)(x)
    packed = pack_padded_sequence(torch.randn(T, B, I, device="meta"), torch.tensor(LENGTHS),
                                  enforce_sorted=False)
    with pytest.raises(ValueError, match="PackedSequence on the meta device"):
        ours(packed)
    ours.to_empty(device="cpu")
    torch.manual_seed(3)
    src = NN[kind](I, H, **config)
    ours.load_state_dict(src.state_dict())
    xc = torch.randn(x.shape)
    torch.testing.assert_close(ours(xc)[0], src(xc)[0], rtol=1e-5, atol=1e-6)


def test_forget_bias_is_a_constant_on_the_forget_gate():
    """forget_bias=f equals adding f to bias_ih's forget block (gradients unchanged)."""
    torch.manual_seed(0)
    a = bt.LSTM(I, H, forget_bias=0.75, dtype=torch.float64)
    b = bt.LSTM(I, H, dtype=torch.float64)
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        b.bias_ih_l0[H:2 * H] += 0.75
    x = _rand(T, B, I, seed=3)
    for m in (a, b):
        y, (h, c) = m(x)
        (y * _weights(y.shape, y.dtype)).sum().backward()
    torch.testing.assert_close(a(x)[0], b(x)[0], rtol=1e-14, atol=1e-14)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-13, atol=1e-14)


# ---------------------------------------------------------------------------
# Training: SGD + weight decay + clip_grad_norm_, step by step
# ---------------------------------------------------------------------------

class _LM(nn.Module):
    """Embedding -> 2-layer RNN -> Linear, the word-LM shape of issue 27."""

    def __init__(self, rnn, vocab=17, emb=I):
        super().__init__()
        self.emb, self.rnn = nn.Embedding(vocab, emb), rnn
        self.out = nn.Linear((2 if rnn.bidirectional else 1) * H, vocab)

    def forward(self, tokens, hidden):
        y, hidden = self.rnn(self.emb(tokens), hidden)
        return self.out(y), hidden


def _detach(hidden):
    return tuple(h.detach() for h in hidden) if isinstance(hidden, tuple) else hidden.detach()


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
        hidden = _detach(hidden)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_sgd_with_clipping_equals_nn(kind):
    """20 steps of SGD (lr 2, weight decay, clip_grad_norm_ 0.25, hidden detached between
    batches) from one initial state: every loss and the final parameters equal nn's to
    float64 rounding."""
    ref_rnn, our_rnn = _pair(kind, num_layers=2)
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
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed_unsorted"])
@pytest.mark.parametrize("bias,batch_first", [(True, False), (False, True)],
                         ids=["bias", "nobias_batch_first"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_stacked_bidirectional_matches_nn(kind, dtype, tol, packed, bias, batch_first):
    """nn.LSTM / nn.GRU(num_layers=2, bidirectional=True) and the blockrnn module with the
    same parameters: outputs, final states, input / state gradients and every parameter
    gradient agree."""
    ref, ours = _pair(kind, dtype, num_layers=2, bidirectional=True, bias=bias,
                      batch_first=batch_first)
    n_states = 2 if kind == "lstm" else 1
    lengths = torch.tensor(LENGTHS)
    shape = (B, T, I) if batch_first else (T, B, I)
    xs = [_rand(*shape, dtype=dtype, seed=1) for _ in range(2)]
    st = [[_rand(4, B, H, dtype=dtype, seed=2 + k) for k in range(n_states)] for _ in range(2)]
    hx = [tuple(s) if kind == "lstm" else s[0] for s in st]
    pk = lambda x: pack_padded_sequence(x, lengths, batch_first=batch_first,  # noqa: E731
                                        enforce_sorted=False)
    y_ref, s_ref = ref(pk(xs[0]), hx[0])
    if packed:
        y, s = ours(pk(xs[1]), hx[1])
        assert isinstance(y, PackedSequence)
        assert torch.equal(y.unsorted_indices, y_ref.unsorted_indices)
        y, y_ref = y.data, y_ref.data
    else:
        y, s = ours(xs[1], hx[1], sequence_length=lengths)
        y_ref, _ = pad_packed_sequence(y_ref, batch_first=batch_first, total_length=T)
    s, s_ref = (s, s_ref) if kind == "lstm" else ((s,), (s_ref,))
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


# ---------------------------------------------------------------------------
# The custom ops: gradcheck, opcheck
# ---------------------------------------------------------------------------

def _op_cases():
    """(name, op, args, indices of the differentiable args) for every op variant."""
    Tc, Bc, Ic, Hc = 4, 3, 3, 2
    lengths = torch.tensor([4, 0, 2])
    x = _rand(Tc, Bc, Ic, seed=1)
    h0, c0 = _rand(Bc, Hc, seed=2), _rand(Bc, Hc, seed=3)
    cases = []
    for lens, rev in ((None, False), (lengths, True), (lengths, False)):
        tag = f"{'lengths' if lens is not None else 'full'}-{'rev' if rev else 'fwd'}"
        w_ih, w_hh = _rand(4 * Hc, Ic, seed=4), _rand(4 * Hc, Hc, seed=5)
        b_ih, b_hh = _rand(4 * Hc, seed=6), _rand(4 * Hc, seed=7)
        peep = [_rand(Hc, seed=8 + k) for k in range(3)]
        cases.append((f"lstm-{tag}", bt.lstm_op,
                      (x, h0, c0, w_ih, w_hh, b_ih, b_hh, None, None, None, lens, 0.0, 0.0,
                       rev), (0, 1, 2, 3, 4, 5, 6)))
        cases.append((f"lstm_peephole-{tag}", bt.lstm_op,
                      (x, h0, c0, w_ih, w_hh, None, None, *peep, lens, 0.0, 0.5, rev),
                      (0, 1, 2, 3, 4, 7, 8, 9)))
        cases.append((f"gru-{tag}", bt.gru_op,
                      (x, h0, _rand(3 * Hc, Ic, seed=11), _rand(3 * Hc, Hc, seed=12),
                       _rand(3 * Hc, seed=13), _rand(3 * Hc, seed=14), lens, rev),
                      (0, 1, 2, 3, 4, 5)))
        cases.append((f"gru_block-{tag}", bt.gru_block_op,
                      (x, h0, _rand(Ic + Hc, 2 * Hc, seed=15), _rand(Ic + Hc, Hc, seed=16),
                       _rand(2 * Hc, seed=17), _rand(Hc, seed=18), lens, rev),
                      (0, 1, 2, 3, 4, 5)))
    return cases


CASES = _op_cases()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gradcheck_ops(case):
    _, op, args, diff = case
    args = list(args)

    def f(*ts):
        a = list(args)
        for i, t in zip(diff, ts):
            a[i] = t
        out = op(*a)
        return out[:2] if op is bt.lstm_op else out[0]

    assert torch.autograd.gradcheck(f, [args[i] for i in diff], eps=1e-6, atol=1e-8,
                                    rtol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_opcheck(case):
    """torch.library.opcheck: schema, autograd registration, fake tensors, AOT dispatch
    (static and dynamic shapes), forward op and, through its autograd, the backward op."""
    _, op, args, _ = case
    torch.library.opcheck(op, args)
    torch.library.opcheck(*_backward_case(op, args))


def _backward_case(op, args):
    """(the backward op of forward op `op`, its arguments for the forward's `args`)."""
    backward = {bt.lstm_op: bt.lstm_backward_op, bt.gru_op: bt.gru_backward_op,
                bt.gru_block_op: bt.gru_block_backward_op}[op]
    with torch.no_grad():
        out = op(*args)
    if op is bt.lstm_op:
        x, h0, c0, w_ih, w_hh, b_ih, b_hh, wci, wcf, wco, lens, _, fb, rev = args
        bargs = (x, h0, c0, w_ih, w_hh, b_ih, b_hh, wci, wcf, wco, lens, fb, rev, *out,
                 _weights(out[0].shape, x.dtype), _weights(out[1].shape, x.dtype, seed=3))
    else:
        *first, lens, rev = args
        bargs = (*first, lens, rev, *out, _weights(out[0].shape, args[0].dtype))
    return backward, tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in bargs)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_ops_refuse_x_of_another_rank(case):
    """Every op, forward and backward, given x of rank 1, 2 or 4 raises a ValueError
    naming x and the shape it must have (not an unpacking error of its own code)."""
    _, op, args, _ = case
    backward, bargs = _backward_case(op, args)
    x = args[0]
    for bad in (x[:, 0, 0], x[:, :, 0], x[..., None]):
        for fn, fn_args in ((op, args), (backward, bargs)):
            with pytest.raises(ValueError, match=r"x must have shape \(T, B, I\), got "
                                                 + re.escape(str(tuple(bad.shape)))):
                fn(bad, *fn_args[1:])


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_ops_name_both_tensors_of_a_dtype_mismatch(case):
    """An op's tensor of another dtype than its first weight's is refused naming both (the
    message spoke of a module's "parameters", which an op call does not have)."""
    _, op, args, _ = case
    names = [a.name for a in op._opoverload._schema.arguments]
    source = "weight_ih" if "weight_ih" in names else "w_ru"
    for i, (name, t) in enumerate(zip(names, args)):
        if not isinstance(t, torch.Tensor) or name in (source, "lengths"):
            continue
        bad = list(args)
        bad[i] = t.detach().float()
        with pytest.raises(TypeError, match=f"{name} has dtype torch.float32 but {source} has "
                                            f"torch.float64; the op's tensors must share"):
            op(*bad)


def test_op_outputs_are_fresh():
    """No output aliases an input or another output (functional ops)."""
    for _, op, args, _ in CASES:
        with torch.no_grad():
            out = op(*args)
        ptrs = [t.untyped_storage().data_ptr() for t in out]
        ins = [a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)]
        assert len(set(ptrs)) == len(ptrs) and not set(ptrs) & set(ins)


# ---------------------------------------------------------------------------
# torch.compile (fullgraph) and torch.export
# ---------------------------------------------------------------------------

def _lm(kind, **config):
    torch.manual_seed(0)
    rnn = OURS[kind](I, H, 2, dropout=0.2, **config)
    return _LM(rnn).double().eval()


def _run_lm(model, tokens, lengths):
    logits, hidden = model.rnn(model.emb(tokens), None, sequence_length=lengths)
    hidden = hidden if isinstance(hidden, tuple) else (hidden,)
    return model.out(logits), hidden


class _Wrapped(nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, tokens, lengths):
        return _run_lm(self.lm, tokens, lengths)


@pytest.mark.parametrize("kind,config", [("lstm", {}), ("lstm", dict(bidirectional=True,
                                                                       use_peephole=True)),
                                          ("gru", {}), ("gru", dict(reset_after=False))],
                         ids=["lstm", "lstm_bi_peephole", "gru", "gru_reset_before"])
def test_compile_fullgraph_forward_and_backward(kind, config):
    """torch.compile(fullgraph=True) traces Embedding -> blockrnn module -> Linear with no
    graph break (fullgraph raises on one); its outputs and gradients equal eager."""
    torch._dynamo.reset()
    model = _Wrapped(_lm(kind, **config))
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


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_compile_fullgraph_packed_sequence_input(kind):
    """An unsorted PackedSequence made outside the compiled region goes through with no
    graph break (the module pads and packs with index ops, not with torch's helpers that
    Dynamo skips); outputs and gradients equal eager and nn's."""
    torch._dynamo.reset()
    ref, ours = _pair(kind, num_layers=2, bidirectional=True)
    x = _rand(T, B, I, seed=1)

    def f(module, pk):
        y, s = module(pk)
        return (y.data, *s) if kind == "lstm" else (y.data, s)

    compiled = torch.compile(lambda pk: f(ours, pk), fullgraph=True)
    grads = []
    for fn in (compiled, lambda pk: f(ours, pk), lambda pk: f(ref, pk)):
        x.grad = None
        for m in (ours, ref):
            m.zero_grad()
        outs = fn(pack_padded_sequence(x, torch.tensor(LENGTHS), enforce_sorted=False))
        _loss(outs[0], outs[1:]).backward()
        grads.append([o.detach() for o in outs] + [x.grad.clone()])
    for a, b, c in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-10)


def test_compile_training_mode_with_dropout_fullgraph():
    """Dropout between layers (training mode) traces too; the compiled model trains."""
    torch._dynamo.reset()
    model = _Wrapped(_lm("lstm").train())
    compiled = torch.compile(model, fullgraph=True)
    tokens = torch.randint(0, 17, (T, B), generator=torch.Generator().manual_seed(5))
    y, hidden = compiled(tokens, torch.tensor(LENGTHS))
    _loss(y, hidden).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all()
               for p in model.parameters())


@pytest.mark.parametrize("kind,config", [("lstm", dict(bidirectional=True)), ("gru", {}),
                                          ("gru", dict(reset_after=False))],
                         ids=["lstm_bi", "gru", "gru_reset_before"])
def test_export_runs_and_equals_eager(kind, config):
    model = _Wrapped(_lm(kind, **config))
    tokens = torch.randint(0, 17, (T, B), generator=torch.Generator().manual_seed(5))
    lengths = torch.tensor(LENGTHS)
    program = torch.export.export(model, (tokens, lengths))
    targets = {n.target for n in program.graph.nodes if n.op == "call_function"}
    assert any("blockrnn" in str(t) for t in targets)
    other = torch.randint(0, 17, (T, B), generator=torch.Generator().manual_seed(6))
    for tok in (tokens, other):
        y, hidden = program.module()(tok, lengths)
        with torch.no_grad():
            y0, hidden0 = model(tok, lengths)
        torch.testing.assert_close(y, y0, rtol=0, atol=0)
        for a, b in zip(hidden, hidden0):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore")   # the tracer's warnings (Python values in the trace)
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_jit_trace_round_trip_and_script_refused_clearly(kind, tmp_path):
    """torch.jit.trace records the blockrnn:: ops: the saved and reloaded trace runs
    another (T, B) and equals eager bit for bit. torch.jit.script, of the module or of a
    model holding it, raises a RuntimeError that says what to use instead (not
    TorchScript's parse error from inside forward), and leaves the model as it was."""
    torch.manual_seed(0)
    rnn = OURS[kind](I, H, num_layers=2, bidirectional=True).double()
    traced = torch.jit.trace(rnn, (_rand(T, B, I, requires_grad=False),), check_trace=False)
    torch.jit.save(traced, tmp_path / "rnn.pt")
    loaded = torch.jit.load(tmp_path / "rnn.pt")
    assert "blockrnn::" in loaded.graph.str()
    x = _rand(T + 3, B - 1, I, seed=3, requires_grad=False)
    for got, want in zip(loaded(x), rnn(x)):
        for g, w in zip(*((t,) if torch.is_tensor(t) else t for t in (got, want))):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    model = _Wrapped(_lm(kind))
    for target in (rnn, model):
        with pytest.raises(RuntimeError, match=r"cannot be compiled by torch.jit.script.*"
                                               r"torch.jit.trace"):
            torch.jit.script(target)
    assert isinstance(model.lm.rnn, OURS[kind])


# ---------------------------------------------------------------------------
# Upgrading a 0.1 state_dict
# ---------------------------------------------------------------------------

def _v01_state_dict(ref, peepholes=None):
    """What blockrnn 0.1's LSTM.from_torch(ref).state_dict() held: w_l{k} = [W_ih^T; W_hh^T],
    b_l{k} = b_ih + b_hh (only with bias), peepholes wci/wcf/wco_l{k}."""
    sd = {}
    D = 2 if ref.bidirectional else 1
    for k in range(ref.num_layers):
        for s in ("", "_reverse")[:D]:
            sfx = f"_l{k}{s}"
            sd[f"w{sfx}"] = torch.cat([getattr(ref, f"weight_ih{sfx}").detach().T,
                                       getattr(ref, f"weight_hh{sfx}").detach().T])
            if ref.bias:
                sd[f"b{sfx}"] = (getattr(ref, f"bias_ih{sfx}")
                                 + getattr(ref, f"bias_hh{sfx}")).detach()
            if peepholes is not None:
                for n, v in zip(("wci", "wcf", "wco"), peepholes):
                    sd[f"{n}{sfx}"] = v
    return sd


@pytest.mark.parametrize("bias", [True, False])
def test_upgrade_state_dict_v01(bias):
    ref, _ = _pair("lstm", num_layers=2, bidirectional=True, bias=bias)
    old = _v01_state_dict(ref)
    before = {k: v.clone() for k, v in old.items()}
    ours = bt.LSTM(I, H, 2, bidirectional=True, bias=bias, dtype=torch.float64)
    new = bt.upgrade_state_dict_v01(old, ours)
    ours.load_state_dict(new, strict=True)
    assert all(torch.equal(old[k], before[k]) for k in old)          # input unchanged
    torch.testing.assert_close(ours.weight_ih_l1_reverse, ref.weight_ih_l1_reverse,
                               rtol=0, atol=0)
    if bias:   # the folded bias lands in bias_ih, bias_hh is zero
        assert not ours.bias_hh_l0.any()
        torch.testing.assert_close(ours.bias_ih_l1, ref.bias_ih_l1 + ref.bias_hh_l1,
                                   rtol=0, atol=0)
    x = _rand(T, B, I, seed=1, requires_grad=False)
    with torch.no_grad():
        y, (h, c) = ours(x)
        y_ref, (h_ref, c_ref) = ref(x)
    for a, b in ((y, y_ref), (h, h_ref), (c, c_ref)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_upgrade_state_dict_v01_peepholes_gru_and_errors():
    torch.manual_seed(0)
    ref = nn.LSTM(I, H, dtype=torch.float64)
    peep = [_rand(H, seed=k, requires_grad=False) for k in range(3)]
    ours = bt.LSTM(I, H, use_peephole=True, dtype=torch.float64)
    ours.load_state_dict(bt.upgrade_state_dict_v01(_v01_state_dict(ref, peep), ours))
    for name, v in zip(bt._PEEPHOLES, peep):
        assert torch.equal(getattr(ours, f"{name}_l0"), v)
    old_gru = bt.GRU(I, H, reset_after=False).state_dict()       # 0.1's GRU names
    fresh = bt.GRU(I, H, reset_after=False)
    fresh.load_state_dict(bt.upgrade_state_dict_v01(old_gru, fresh), strict=True)
    with pytest.raises(ValueError, match="reset_after=False"):
        bt.upgrade_state_dict_v01(old_gru, bt.GRU(I, H))
    with pytest.raises(ValueError, match="no 'w_l0' in the state_dict"):
        bt.upgrade_state_dict_v01(ref.state_dict(), bt.LSTM(I, H))
    with pytest.raises(ValueError, match=r"w_l0 has shape \(8, 12\), the module needs"):
        bt.upgrade_state_dict_v01(_v01_state_dict(ref), bt.LSTM(I + 1, H))
    with pytest.raises(ValueError, match="wci_l0 is nonzero but the module has "
                                         "use_peephole=False"):
        bt.upgrade_state_dict_v01(_v01_state_dict(ref, peep), bt.LSTM(I, H))

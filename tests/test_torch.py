"""blockrnn.torch: autograd functions and nn.Modules over the sequence ops.

PyTorch is required (the test extras install it): a missing torch FAILS these tests.
"""
import contextlib
import subprocess
import sys

import numpy as np
import pytest

try:
    import torch
    from torch import nn
except ImportError as exc:  # pragma: no cover - depends on the environment
    pytest.fail(f"PyTorch is required for the blockrnn.torch tests ({exc!r}); install the "
                f"test extras with `pip install -e .[test]`", pytrace=False)

import blockrnn.convert
import blockrnn.torch as bt
from blockrnn.torch import BlockGRUFunction, BlockLSTMFunction

T, B, I, H = 5, 3, 4, 3


def _rand(*shape, dtype=torch.float64, seed=0, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(*shape, generator=g, dtype=dtype) * 2 - 1
    return t.requires_grad_(requires_grad)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("lengths", [None, np.array([5, 0, 2])], ids=["full", "lengths"])
@pytest.mark.parametrize("peephole", [False, True])
def test_gradcheck_lstm(peephole, lengths, reverse):
    x, h0, c0 = _rand(T, B, I, seed=1), _rand(B, H, seed=2), _rand(B, H, seed=3)
    w = _rand(I + H, 4 * H, seed=4) * (1 / np.sqrt(I + H))
    w = w.detach().requires_grad_()
    b, wci, wcf, wco = (_rand(k, seed=5 + n) for n, k in enumerate((4 * H, H, H, H)))

    def f(x, h0, c0, w, b, wci, wcf, wco):
        h, cs = BlockLSTMFunction.apply(x, h0, c0, w, wci, wcf, wco, b, peephole, 0.0,
                                        lengths, reverse)
        last = bt._first if reverse else bt._final
        return h, cs, last(h, h0, lengths), last(cs, c0, lengths)

    inputs = (x, h0, c0, w, b) + ((wci, wcf, wco) if peephole else
                                  tuple(t.detach() for t in (wci, wcf, wco)))
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("lengths", [None, np.array([5, 0, 2])], ids=["full", "lengths"])
def test_gradcheck_gru(lengths, reverse):
    x, h0 = _rand(T, B, I, seed=1), _rand(B, H, seed=2)
    w_ru = (_rand(I + H, 2 * H, seed=3) / np.sqrt(I + H)).detach().requires_grad_()
    w_c = (_rand(I + H, H, seed=4) / np.sqrt(I + H)).detach().requires_grad_()
    b_ru, b_c = _rand(2 * H, seed=5), _rand(H, seed=6)

    def f(x, h0, w_ru, w_c, b_ru, b_c):
        h = BlockGRUFunction.apply(x, h0, w_ru, w_c, b_ru, b_c, lengths, reverse)
        return h, (bt._first if reverse else bt._final)(h, h0, lengths)

    assert torch.autograd.gradcheck(f, (x, h0, w_ru, w_c, b_ru, b_c), eps=1e-6, atol=1e-8,
                                    rtol=1e-6)


def test_gradcheck_modules_with_hx():
    """The nn.Module path, hx gradients included (batch_first, peepholes)."""
    lstm = bt.LSTM(I, H, batch_first=True, use_peephole=True).double()
    gru = bt.GRU(I, H).double()
    x = _rand(B, T, I, seed=7)
    h0, c0 = _rand(1, B, H, seed=8), _rand(1, B, H, seed=9)

    def f_lstm(x, h0, c0):
        y, (h_n, c_n) = lstm(x, (h0, c0))
        return y, h_n, c_n

    def f_gru(x, h0):
        y, h_n = gru(x.transpose(0, 1), h0)
        return y, h_n

    assert torch.autograd.gradcheck(f_lstm, (x, h0, c0), eps=1e-6, atol=1e-8)
    assert torch.autograd.gradcheck(f_gru, (x, h0), eps=1e-6, atol=1e-8)


def _run(module, x, hx):
    y, state = module(x, hx)
    h_n, c_n = state
    loss = (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)).sum() \
        + (h_n ** 2).sum() + (c_n * 0.5).sum()
    loss.backward()
    return y, h_n, c_n


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)],
                         ids=["float64", "float32"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch_first", [False, True])
def test_from_torch_matches_nn_lstm(dtype, tol, bias, batch_first):
    torch.manual_seed(0)
    ref = nn.LSTM(I, H, bias=bias, batch_first=batch_first).to(dtype)
    ours = bt.LSTM.from_torch(ref)
    assert ours.weight_ih_l0.dtype == dtype and ours.batch_first == batch_first
    assert ours.bias == bias and ("bias_ih_l0" in dict(ours.named_parameters())) == bias
    shape = (B, T, I) if batch_first else (T, B, I)
    xs = [_rand(*shape, dtype=dtype, seed=1) for _ in range(2)]
    h0s = [_rand(1, B, H, dtype=dtype, seed=2) for _ in range(2)]
    c0s = [_rand(1, B, H, dtype=dtype, seed=3) for _ in range(2)]
    out_ref = _run(ref, xs[0], (h0s[0], c0s[0]))
    out = _run(ours, xs[1], (h0s[1], c0s[1]))
    for a, r in zip(out, out_ref):
        torch.testing.assert_close(a, r, rtol=tol, atol=tol)
    for a, r in ((xs[1], xs[0]), (h0s[1], h0s[0]), (c0s[1], c0s[0])):
        torch.testing.assert_close(a.grad, r.grad, rtol=tol, atol=tol)
    mine = dict(ours.named_parameters())
    assert list(mine) == [n for n, _ in ref.named_parameters()]
    for name, p in ref.named_parameters():
        torch.testing.assert_close(mine[name].grad, p.grad, rtol=tol, atol=tol)


def test_nn_lstm_call_conventions():
    """hx=None, unbatched input, shapes of (h_n, c_n), sequence_length."""
    torch.manual_seed(0)
    ref = nn.LSTM(I, H).double()
    ours = bt.LSTM.from_torch(ref)
    x = _rand(T, B, I, seed=1, requires_grad=False)
    y, (h, c) = ours(x)
    y_r, (h_r, c_r) = ref(x)
    assert h.shape == c.shape == (1, B, H)
    for a, r in ((y, y_r), (h, h_r), (c, c_r)):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12)
    y, (h, c) = ours(x[:, 0])                       # unbatched (T, I)
    y_r, (h_r, c_r) = ref(x[:, 0])
    assert y.shape == (T, H) and h.shape == (1, H)
    for a, r in ((y, y_r), (h, h_r), (c, c_r)):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12)
    # sequence_length: row b stops after len_b steps, like a packed sequence.
    lengths = torch.tensor([5, 2, 0])
    y, (h, c) = ours(x, sequence_length=lengths)
    packed = nn.utils.rnn.pack_padded_sequence(x[:, :2], lengths[:2], enforce_sorted=True)
    y_p, (h_p, c_p) = ref(packed)
    y_p, _ = nn.utils.rnn.pad_packed_sequence(y_p, total_length=T)
    torch.testing.assert_close(y[:, :2], y_p, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h[:, :2], h_p, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(c[:, :2], c_p, rtol=1e-12, atol=1e-12)
    assert torch.all(y[:, 2] == 0) and torch.all(h[:, 2] == 0) and torch.all(c[:, 2] == 0)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
def test_zero_steps_return_the_initial_states(kind, grad):
    """T = 0 (nn raises "Expected sequence length to be larger than 0"; README): y is
    empty and the final states are the initial ones, as new tensors; the gradient of
    the initial states is the final states' (the identity), the parameters' zero."""
    module = (bt.LSTM if kind == "lstm" else bt.GRU)(I, H, num_layers=2,
                                                     bidirectional=True).float()
    states = [_rand(4, B, H, seed=s, dtype=torch.float32, requires_grad=grad) for s in (1, 2)]
    hx = tuple(states) if kind == "lstm" else states[0]
    x = torch.zeros(0, B, I)
    with torch.set_grad_enabled(grad):
        y, finals = module(x, hx)
    finals = finals if kind == "lstm" else (finals,)
    assert y.shape == (0, B, 2 * H)
    for f, s in zip(finals, states):
        assert torch.equal(f, s) and f.data_ptr() != s.data_ptr()
    if grad:
        weights = [_rand(4, B, H, seed=5 + k, dtype=torch.float32, requires_grad=False)
                   for k in range(len(finals))]
        sum((f * w).sum() for f, w in zip(finals, weights)).backward()
        for s, w in zip(states, weights):
            assert torch.equal(s.grad, w)
        assert all(p.grad is None or not p.grad.any() for p in module.parameters())


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_all_lengths_zero_give_zero_weight_gradients(kind, dtype):
    """Every row of length 0 (the kernels run no step, L = 0): the final states are the
    initial ones, and the backward writes zeros into every weight gradient (in nn's
    layout, through the strides the kernels write it with) and into x's."""
    module = (bt.LSTM if kind == "lstm" else bt.GRU)(I, H, bidirectional=True).to(dtype)
    x = _rand(T, B, I, seed=3, dtype=dtype, requires_grad=True)
    states = [_rand(2, B, H, seed=s, dtype=dtype, requires_grad=True) for s in (1, 2)]
    hx = tuple(states) if kind == "lstm" else states[0]
    y, finals = module(x, hx, sequence_length=[0] * B)
    finals = finals if kind == "lstm" else (finals,)
    (y.sum() + sum(f.sum() for f in finals)).backward()
    assert not y.any()
    for f, s in zip(finals, states):
        assert torch.equal(f, s)
        assert torch.equal(s.grad, torch.ones_like(s))
    assert not x.grad.any()
    for name, p in module.named_parameters():
        assert p.grad is not None and not p.grad.any(), name


def _module_with(make, name, spoil, path, monkeypatch):
    """make()'s module in the dtype of `path` ("float64", "bfloat16", else float32) with
    its parameter `name` replaced by spoil(parameter), the eager fast path off for "ops";
    and an input (T, B, I) of that dtype."""
    dtype = {"float64": torch.float64, "bfloat16": torch.bfloat16}.get(path, torch.float32)
    module = make().to(dtype)
    setattr(module, name, spoil(getattr(module, name).detach()))
    if path == "ops":
        monkeypatch.setattr(bt, "_FAST_FUNCTION", {})
    return module, torch.randn(T, B, I, dtype=dtype)


@pytest.mark.parametrize("make,name", [
    (lambda: bt.GRU(I, H), "bias_hh_l0"), (lambda: bt.GRU(I, H), "bias_ih_l0"),
    (lambda: bt.GRU(I, H, reset_after=False), "b_c_l0"),
    (lambda: bt.GRU(I, H, reset_after=False), "b_ru_l0"),
    (lambda: bt.LSTM(I, H), "bias_hh_l0"), (lambda: bt.LSTM(I, H, proj_size=2), "bias_hh_l0"),
    (lambda: bt.LSTM(I, H, use_peephole=True), "weight_cf_l0"),
    (lambda: bt.LSTM(I, H, use_peephole=True), "weight_ci_l0")],
    ids=["gru-b_hh", "gru-b_ih", "tf-gru-b_c", "tf-gru-b_ru", "lstm-b_hh", "lstm-proj-b_hh",
         "lstm-w_cf", "lstm-w_ci"])
@pytest.mark.parametrize("path", ["fast", "ops", "no_grad", "float64"])
def test_one_of_a_cells_biases_or_peepholes_set_to_none_is_refused(make, name, path,
                                                                   monkeypatch):
    """A cell's biases (and peepholes) go together: with one of them set to None the call
    raises a ValueError naming them, on every path -- the fast path read None where the
    kernels read an array (a segfault), or zeros for both when the first was None (the
    other ignored)."""
    module, x = _module_with(make, name, lambda p: None, path, monkeypatch)
    with torch.set_grad_enabled(path != "no_grad"):
        with pytest.raises(ValueError, match=r"must (both|all) be given or (both|all) be None"):
            module(x)


_REQUIRED = [(lambda: bt.GRU(I, H), "weight_ih_l0"), (lambda: bt.GRU(I, H), "weight_hh_l0"),
             (lambda: bt.GRU(I, H, reset_after=False), "w_ru_l0"),
             (lambda: bt.GRU(I, H, reset_after=False), "w_c_l0"),
             (lambda: bt.LSTM(I, H), "weight_ih_l0"), (lambda: bt.LSTM(I, H), "weight_hh_l0"),
             (lambda: bt.LSTM(I, H, proj_size=2), "weight_hr_l0"),
             (lambda: bt.LSTM(I, H, num_layers=2, bidirectional=True), "weight_hh_l1_reverse")]
_REQUIRED_IDS = ["gru-w_ih", "gru-w_hh", "tf-gru-w_ru", "tf-gru-w_c", "lstm-w_ih", "lstm-w_hh",
                 "lstm-proj-w_hr", "lstm-stacked-w_hh"]


@pytest.mark.parametrize("make,name", _REQUIRED, ids=_REQUIRED_IDS)
@pytest.mark.parametrize("path", ["fast", "ops", "no_grad", "float64"])
def test_a_required_weight_set_to_none_is_refused(make, name, path, monkeypatch):
    """torch lets a user assign None to a registered parameter: a weight the call
    cannot run without then raises a TypeError naming it, on every path (it was an
    AttributeError about NoneType deep in the plumbing); conversions refuse it too."""
    module, x = _module_with(make, name, lambda p: None, path, monkeypatch)
    with torch.set_grad_enabled(path != "no_grad"):
        with pytest.raises(TypeError, match=rf"blockrnn.torch.(LSTM|GRU): {name} must be a "
                                            rf"tensor, got None"):
            module(x)
    with pytest.raises(TypeError, match=rf"from_torch: the module's {name} must be a tensor, "
                                        rf"got NoneType"):
        blockrnn.convert.from_torch(module)


_BAD_WEIGHT = {"0-d": lambda p: p.reshape(-1)[0].clone(),
               "short": lambda p: p[..., :-1].clone(),
               "meta": lambda p: torch.empty(p.shape, dtype=p.dtype, device="meta"),
               "int64": lambda p: p.to(torch.int64), "float64": lambda p: p.double()}
# (module, a weight to spoil, the names an error about it may use: the module's, the op's
# argument's or the NumPy kernel's; the first weight sets the module's dtype and device,
# and an input of the others' dtype or device is not blamed for it)
_SPOILED = [(lambda: bt.GRU(I, H), "weight_hh_l0", ("weight_hh", "w_hh")),
            (lambda: bt.GRU(I, H, bias=False), "weight_ih_l0", ("weight_ih", "w_ih")),
            (lambda: bt.GRU(I, H, reset_after=False), "w_c_l0", ("w_c",)),
            (lambda: bt.GRU(I, H, reset_after=False, bias=False), "w_ru_l0", ("w_ru",)),
            (lambda: bt.LSTM(I, H), "bias_hh_l0", ("bias_hh", "b_hh")),
            (lambda: bt.LSTM(I, H, bias=False), "weight_hh_l0", ("weight_hh", "w_hh")),
            (lambda: bt.LSTM(I, H, use_peephole=True), "weight_co_l0", ("weight_co", "wco")),
            (lambda: bt.LSTM(I, H, proj_size=2, bias=False), "weight_hr_l0", ("weight_hr",))]


@pytest.mark.parametrize("make,name,says", _SPOILED,
                         ids=["gru-w_hh", "gru-nobias-w_ih", "tf-gru-w_c", "tf-gru-nobias-w_ru",
                              "lstm-b_hh", "lstm-nobias-w_hh", "lstm-w_co", "lstm-proj-w_hr"])
@pytest.mark.parametrize("bad", sorted(_BAD_WEIGHT))
@pytest.mark.parametrize("path", ["fast", "ops", "no_grad", "bfloat16"])
def test_a_weight_of_another_rank_dtype_or_device_is_refused_by_name(make, name, says, bad,
                                                                     path, monkeypatch):
    """A weight assigned with another rank, dtype or device (torch lets a Parameter of any
    shape replace one) raises a TypeError / ValueError naming it on every path: the no-grad
    path converted an integer, float16 or float64 one silently and failed with an
    IndexError on a 0-d one; the bias helpers read a 0-d weight's shape before the
    kernel's checks (IndexError); a meta weight failed in torch's .numpy()."""
    module, x = _module_with(
        make, name, lambda p: nn.Parameter(_BAD_WEIGHT[bad](p), requires_grad=False), path,
        monkeypatch)
    with torch.set_grad_enabled(path != "no_grad"):
        with pytest.raises((TypeError, ValueError)) as info:
            y, _ = module(x)
            y.sum().backward()
    message = str(info.value)
    assert message.startswith(("blockrnn.torch.", "block_")), message
    assert any(n in message for n in says), message


def test_parameters_double_and_needs_input_grad():
    lstm = bt.LSTM(I, H)
    nn_names = ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"]
    assert lstm.weight_ih_l0.dtype == torch.get_default_dtype()
    assert [n for n, _ in lstm.named_parameters()] == nn_names
    assert list(lstm.state_dict()) == nn_names               # no peepholes: no extra state
    peep = bt.LSTM(I, H, use_peephole=True).double()
    assert [n for n, _ in peep.named_parameters()] == nn_names + ["weight_ci_l0",
                                                                  "weight_cf_l0",
                                                                  "weight_co_l0"]
    assert all(p.dtype == torch.float64 for p in peep.parameters())
    assert peep.weight_ci_l0.shape == (H,) and peep.weight_ih_l0.shape == (4 * H, I)
    assert {n: tuple(p.shape) for n, p in bt.GRU(I, H).named_parameters()} == {
        "weight_ih_l0": (3 * H, I), "weight_hh_l0": (3 * H, H), "bias_ih_l0": (3 * H,),
        "bias_hh_l0": (3 * H,)}
    gru = bt.GRU(I, H, reset_after=False).double()
    assert {n: tuple(p.shape) for n, p in gru.named_parameters()} == {
        "w_ru_l0": (I + H, 2 * H), "w_c_l0": (I + H, H), "b_ru_l0": (2 * H,), "b_c_l0": (H,)}
    # Frozen weights and an input without grad: only the requested gradients appear.
    gru.w_c_l0.requires_grad_(False)
    x = _rand(T, B, I, seed=3, requires_grad=False)
    y, h_n = gru(x)
    (y.sum() + h_n.sum()).backward()
    assert x.grad is None and gru.w_c_l0.grad is None and gru.w_ru_l0.grad is not None
    # Nothing requires grad: no graph at all.
    with torch.no_grad():
        y, _ = peep(x)
    assert not y.requires_grad


def test_adam_training_reduces_loss():
    torch.manual_seed(0)
    for model in (bt.LSTM(I, 8, batch_first=True), bt.GRU(I, 8, batch_first=True),
                  bt.GRU(I, 8, batch_first=True, reset_after=False)):
        head = nn.Linear(8, 1)
        opt = torch.optim.Adam(list(model.parameters()) + list(head.parameters()), lr=0.02)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(16, 10, I, generator=g)
        target = x[:, :, :1].cumsum(1) * 0.3          # needs memory across steps
        losses = []
        for _ in range(60):
            opt.zero_grad()
            y, _ = model(x)
            loss = ((head(y) - target) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[-1] < 0.3 * losses[0], (type(model).__name__, losses[::10])


@pytest.mark.parametrize("grad", [True, False])
def test_states_of_another_dtype_device_or_shape_are_refused(grad):
    """A state that is not exactly what the call runs (_state's fast case takes a CPU
    tensor of the parameters' dtype and shape (L*D, B, H) as it is) reaches the checks,
    on the grad path and the no-grad one."""
    lstm, gru = bt.LSTM(I, H), bt.GRU(I, H)
    x = torch.zeros(T, B, I)
    good = torch.zeros(1, B, H)
    cases = [
        (lstm, (good.double(), good), TypeError, "h0 has dtype torch.float64 but the parameters"),
        (lstm, (good, good.half()), TypeError, "c0 has dtype torch.float16 but the parameters"),
        (lstm, (good, torch.empty(1, B, H, device="meta")), ValueError,
         "c0 is on meta but the parameters are on cpu"),
        (lstm, (torch.zeros(1, B, H + 1), good), ValueError, r"h0 must have shape \(1, 3, 3\)"),
        (gru, good.double(), TypeError, "hx has dtype torch.float64 but the parameters"),
        (gru, torch.zeros(2, B, H), ValueError, r"hx must have shape \(1, 3, 3\)"),
        (gru, torch.zeros(1, B, H, dtype=torch.int64), TypeError, "hx has dtype torch.int64"),
    ]
    with torch.set_grad_enabled(grad):
        for module, hx, error, message in cases:
            with pytest.raises(error, match=message):
                module(x, hx)
    assert lstm.inference_cache_info()["packings"] == 0


def test_errors():
    lstm = bt.LSTM(I, H)
    with pytest.raises(ValueError, match="input is on meta but the parameters are on cpu"):
        lstm(torch.empty(T, B, I, device="meta"))
    with pytest.raises(TypeError, match="input has dtype torch.float16 but the parameters"):
        lstm(torch.zeros(T, B, I, dtype=torch.float16))
    with pytest.raises(TypeError, match="input has dtype torch.float64 but the parameters"):
        lstm(torch.zeros(T, B, I, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"input must have shape \(T, B, I\)"):
        lstm(torch.zeros(T, B, I + 1))
    with pytest.raises(ValueError, match=r"h0 must have shape \(1, 3, 3\)"):
        lstm(torch.zeros(T, B, I), (torch.zeros(B, H), torch.zeros(1, B, H)))
    with pytest.raises(TypeError, match=r"hx must be None or a tuple \(h0, c0\)"):
        lstm(torch.zeros(T, B, I), torch.zeros(1, B, H))
    with pytest.raises(ValueError, match=r"sequence_length entries must be in \[0, T\]"):
        lstm(torch.zeros(T, B, I), sequence_length=[1, 2, 6])
    with pytest.raises(ValueError, match=r"lstm_op: sequence_length entries must be in"):
        lstm(torch.zeros(T, B, I), sequence_length=torch.tensor([1, 2, 6]))
    with pytest.raises(TypeError, match="sequence_length must be an integer array"):
        lstm(torch.zeros(T, B, I), sequence_length=torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match=r"sequence_length must have shape \(B,\) = \(3,\)"):
        lstm(torch.zeros(T, B, I), sequence_length=torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="dtype must be torch.float32, torch.float64, "
                                        "torch.bfloat16 or torch.float16, got torch.int32"):
        bt.GRU(I, H, dtype=torch.int32)
    with pytest.raises(TypeError, match="the parameters must be float32, float64, bfloat16 "
                                        "or float16, got torch.complex64"):
        with pytest.warns(UserWarning, match="Complex modules are a new feature"):
            complex_gru = bt.GRU(I, H).to(torch.complex64)
        complex_gru(torch.zeros(T, B, I, dtype=torch.complex64))
    with pytest.raises(ValueError, match="hidden_size must be positive"):
        bt.GRU(I, 0)
    with pytest.raises(ValueError, match="proj_size=2 cannot be combined with use_peephole"):
        bt.LSTM(I, H, proj_size=2, use_peephole=True)
    with pytest.raises(ValueError, match="reset gate AFTER the recurrent matmul"):
        bt.LSTM.from_torch(nn.GRU(I, H))
    with pytest.raises(TypeError, match="expected a torch.nn.GRU"):
        bt.GRU.from_torch(nn.LSTM(I, H))
    with pytest.raises(TypeError, match="reset_after must be a bool"):
        bt.GRU(I, H, reset_after=1)
    with pytest.raises(TypeError, match="expected a torch.nn.LSTM"):
        bt.LSTM.from_torch(nn.Linear(I, H))


def test_import_blockrnn_does_not_import_torch():
    code = ("import sys, blockrnn, blockrnn.layers, blockrnn.convert; "
            "bad = [m for m in ('torch', 'tensorflow', 'keras') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_torch_adapter_does_not_import_convert():
    """convert -> torch, never the reverse (the two used to import each other)."""
    import ast
    import blockrnn.torch
    tree = ast.parse(open(blockrnn.torch.__file__).read())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    names += [f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
              for a in n.names]
    assert not [m for m in names if "convert" in m], names


@pytest.mark.parametrize("module", [lambda: bt.LSTM(3, 4, dtype=torch.float64),
                                    lambda: bt.LSTM(3, 4, use_peephole=True, cell_clip=1.0,
                                                    dtype=torch.float64),
                                    lambda: bt.GRU(3, 4, dtype=torch.float64),
                                    lambda: bt.GRU(3, 4, reset_after=False,
                                                   dtype=torch.float64)],
                         ids=["lstm", "lstm_peephole", "gru", "gru_reset_before"])
@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
def test_double_backward_raises(module):
    """create_graph=True (a gradient penalty, a Hessian product) needs the gradient
    of the gradient, which blockrnn does not have: a clear error, not a gradient
    silently detached from the graph. First-order gradients still work after."""
    torch.manual_seed(0)
    m = module()
    x = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    y, _ = m(x)
    with pytest.raises(RuntimeError, match="double backward .* not supported"):
        torch.autograd.grad(y.sum(), x, create_graph=True)
    y, _ = m(x)
    with pytest.raises(RuntimeError, match="double backward .* not supported"):
        (y ** 2).sum().backward(create_graph=True)
    y, _ = m(x)
    (gx,) = torch.autograd.grad(y.sum(), x)
    assert gx.shape == x.shape and torch.isfinite(gx).all() and not gx.requires_grad


def test_cell_clip_too_large_for_a_float():
    with pytest.raises(ValueError, match="LSTM: cell_clip must fit a float"):
        bt.LSTM(2, 3, cell_clip=10**400)


class _SeeOps(torch.utils._python_dispatch.TorchDispatchMode):
    """A dispatch mode that records the ops it sees (a user's profiler or flop counter)."""

    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("make", [
    lambda dt: bt.LSTM(5, 6, num_layers=2, bidirectional=True, dtype=dt),
    lambda dt: bt.LSTM(5, 6, use_peephole=True, cell_clip=0.5, forget_bias=1.0, dtype=dt),
    lambda dt: bt.LSTM(5, 6, proj_size=3, bidirectional=True, dtype=dt),
    lambda dt: bt.GRU(5, 6, num_layers=2, bidirectional=True, dtype=dt),
    lambda dt: bt.GRU(5, 6, reset_after=False, bidirectional=True, dtype=dt)],
    ids=["lstm", "lstm-peephole", "lstm-proj", "gru", "tf-gru"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_eager_calls_skip_the_dispatcher_with_the_same_bits(make, dtype):
    """A plain eager training call runs each op's implementation under an
    autograd.Function (blockrnn_<op>), not through the dispatcher: the same outputs
    and gradients, bit for bit, as the custom ops, which a dispatch mode still sees."""
    torch.manual_seed(0)
    layer = make(dtype)
    x = torch.randn(7, 3, 5, dtype=dtype)
    lengths = torch.tensor([7, 4, 0])

    def nodes(node):
        """The class names of the autograd graph's nodes from node."""
        names, stack = set(), [node]
        while stack:
            node = stack.pop()
            if node is not None and type(node).__name__ not in names:
                names.add(type(node).__name__)
                stack.extend(f for f, _ in node.next_functions)
        return names

    def run(mode):
        xg = x.clone().requires_grad_()
        layer.zero_grad()
        with mode:
            y, state = layer(xg, sequence_length=lengths)
        final = state[0] if isinstance(state, tuple) else state
        (y.square().sum() + final.sum()).backward()
        return y, [xg.grad] + [p.grad for p in layer.parameters()], nodes(y.grad_fn)

    y, grads, names = run(contextlib.nullcontext())
    seen = _SeeOps()
    y_op, grads_op, names_op = run(seen)
    assert any(n.startswith("blockrnn_") for n in names), names
    assert not any(n.startswith("blockrnn_") for n in names_op), names_op
    assert any(op.startswith("blockrnn.") for op in seen.ops), seen.ops
    assert torch.equal(y, y_op)
    assert len(grads) == len(grads_op)
    for g, g_op in zip(grads, grads_op):
        assert torch.equal(g, g_op)


def test_eager_calls_take_the_custom_op_where_torch_lacks_the_mode_checks(monkeypatch):
    """Where a torch version lacks the private mode checks _route reads, every call goes
    through the custom ops (the graph has no blockrnn_<op> node) and still trains."""
    monkeypatch.setattr(bt, "_MODES", None)
    layer = bt.LSTM(3, 4)
    x = torch.randn(5, 2, 3, requires_grad=True)
    y, _ = layer(x)
    assert not type(y.grad_fn).__name__.startswith("blockrnn_"), type(y.grad_fn).__name__
    y.sum().backward()
    assert x.grad is not None and layer.weight_hh_l0.grad.abs().sum() > 0


def _train_call(layer, x, hx=None, lengths=None):
    """One training call: y, the final states, the gradients of x, of the given states
    and of every parameter (of a loss that weights every output element differently)."""
    layer.zero_grad(set_to_none=True)
    xg = x.detach().clone().requires_grad_()
    states = [] if hx is None else [s.detach().clone().requires_grad_()
                                    for s in (hx if isinstance(hx, tuple) else (hx,))]
    hxg = None if hx is None else tuple(states) if isinstance(hx, tuple) else states[0]
    y, state = layer(xg, hxg, sequence_length=lengths)
    finals = state if isinstance(state, tuple) else (state,)
    weights = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)
    ((y * weights).sum() + sum((f * f).sum() for f in finals)).backward()
    return ([y, *finals, xg.grad] + [s.grad for s in states]
            + [p.grad for p in layer.parameters()])


def _fast_calls(monkeypatch):
    """Count the calls that take the modules' eager fast path (bt._FAST_FUNCTION)."""
    calls = []
    for op, function in list(bt._FAST_FUNCTION.items()):
        class Counted(function):
            @classmethod
            def apply(cls, *args, _apply=function.apply):
                calls.append(op)
                return _apply(*args)
        monkeypatch.setitem(bt._FAST_FUNCTION, op, Counted)
    return calls


@pytest.mark.parametrize("config", [
    dict(kind="LSTM"), dict(kind="GRU"),
    dict(kind="LSTM", num_layers=2, bidirectional=True, batch_first=True),
    dict(kind="GRU", num_layers=2, bidirectional=True, batch_first=True),
    dict(kind="LSTM", bias=False, bidirectional=True),
    dict(kind="GRU", bias=False, num_layers=2),
    dict(kind="LSTM", use_peephole=True, cell_clip=0.5, forget_bias=1.0, bidirectional=True),
    dict(kind="LSTM", forget_bias=1.0, bias=False),
    dict(kind="GRU", reset_after=False),
    dict(kind="GRU", reset_after=False, num_layers=2, bidirectional=True, batch_first=True),
    dict(kind="GRU", reset_after=False, bias=False, bidirectional=True),
    dict(kind="LSTM", proj_size=2),
    dict(kind="LSTM", proj_size=3, num_layers=2, bidirectional=True, batch_first=True),
    dict(kind="LSTM", proj_size=2, bias=False, bidirectional=True)],
    ids=["lstm", "gru", "lstm-2-bi-bf", "gru-2-bi-bf", "lstm-nobias-bi", "gru-nobias-2",
         "lstm-peephole-clip-fb-bi", "lstm-fb-nobias", "tf-gru", "tf-gru-2-bi-bf",
         "tf-gru-nobias-bi", "lstm-proj", "lstm-proj-2-bi-bf", "lstm-proj-nobias-bi"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("states", ["zeros", "given", "given-transposed"])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
def test_eager_fast_path_equals_the_ops(config, dtype, states, with_lengths, monkeypatch):
    """An eager training call on plain arguments takes the modules' fast path
    (_FAST_FUNCTION: the NumPy kernel functions called directly), which returns the
    ops' outputs, final states and gradients bit for bit, with and without lengths
    (the reverse direction then reversed by copies); a state given non-contiguous
    takes the ops' path."""
    config = dict(config)
    layer = getattr(bt, config.pop("kind"))(5, 6, dtype=dtype, **config)
    torch.manual_seed(1)
    x = torch.randn(4, 3, 5, dtype=dtype)
    D = 2 if layer.bidirectional else 1
    hx = None
    if states != "zeros":
        shape = (layer.num_layers * D, x.shape[0 if layer.batch_first else 1], 6)
        h_shape = shape[:2] + (layer.proj_size or 6,)     # a projected LSTM's h0: P
        h0 = (torch.randn(h_shape[::-1], dtype=dtype).permute(2, 1, 0)
              if states == "given-transposed" else torch.randn(h_shape, dtype=dtype))
        hx = (h0, torch.randn(shape, dtype=dtype)) if isinstance(layer, bt.LSTM) else h0
    T_, B_ = x.shape[:2][::-1] if layer.batch_first else x.shape[:2]
    lengths = torch.tensor([T_, 0, 1, T_ - 1][:B_]) if with_lengths else None
    calls = _fast_calls(monkeypatch)
    fast = _train_call(layer, x, hx, lengths)
    assert len(calls) == (0 if states == "given-transposed" else layer.num_layers * D)
    monkeypatch.setattr(bt, "_FAST_FUNCTION", {})
    ops = _train_call(layer, x, hx, lengths)
    assert len(fast) == len(ops)
    for a, b in zip(fast, ops):
        assert (a is None and b is None) or torch.equal(a, b)


def test_eager_fast_path_leaves_unusual_calls_to_the_ops(monkeypatch):
    """A weight that is not C-contiguous, and a weight of the wrong shape or dtype
    (assigned behind the module's back) go the ops' way: the first gives nn.LSTM's
    answers, the last two the ops' errors, which name the argument; lengths out of
    range raise the op's error from the fast path."""
    calls = _fast_calls(monkeypatch)
    torch.manual_seed(0)
    ours, ref = bt.LSTM(5, 6, dtype=torch.float64), nn.LSTM(5, 6, dtype=torch.float64)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(4, 3, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"lstm_op: sequence_length"):
        ours(x, sequence_length=torch.tensor([5, 2, 1]))
    assert len(calls) == 1
    calls.clear()
    with torch.no_grad():   # the same values, stored transposed
        w = ours.weight_hh_l0.detach().clone()
        ours.weight_hh_l0 = nn.Parameter(w.T.contiguous().T)
    assert not ours.weight_hh_l0.is_contiguous()
    torch.testing.assert_close(ours(x)[0], ref(x)[0], rtol=1e-12, atol=1e-12)
    assert calls == []
    ours.weight_hh_l0 = nn.Parameter(w.contiguous())
    ours(x)
    assert len(calls) == 1
    ours.weight_hh_l0.data = torch.zeros(24, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match="w_hh"):
        ours(x)
    ours.weight_hh_l0.data = w.float()
    with pytest.raises(TypeError, match="weight_hh"):
        ours(x)
    assert len(calls) == 1


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_eager_fast_path_refuses_double_backward(kind, monkeypatch):
    """The fast path's backward is first-order only, as the ops' (a RuntimeError, not
    a silently missing second-order term)."""
    calls = _fast_calls(monkeypatch)
    layer = getattr(bt, kind)(3, 4, dtype=torch.float64)
    x = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    y, _ = layer(x)
    assert calls
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(y.square().sum(), x, create_graph=True)


def _relayout(t):
    """A saved_tensors_hooks pack hook: the same values stored column-major."""
    return t.transpose(0, -1).contiguous().transpose(0, -1) if t.dim() >= 2 else t


@pytest.mark.parametrize("config,fast", [
    (dict(kind="LSTM", bidirectional=True, use_peephole=True), True),
    (dict(kind="GRU", num_layers=2), True), (dict(kind="GRU", reset_after=False), True),
    (dict(kind="LSTM", proj_size=2), True)],
    ids=["lstm_bi_peephole", "gru_2layer", "gru_reset_before", "lstm_proj"])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
def test_saved_tensors_hooks(config, fast, with_lengths, monkeypatch):
    """Under torch.autograd.graph.saved_tensors_hooks -- one that hands the saved
    tensors back in another layout, and save_on_cpu -- a training call's outputs and
    gradients equal the plain call's bit for bit, on the fast path (`fast`) and the
    ops' path."""
    calls = _fast_calls(monkeypatch)
    config = dict(config)
    torch.manual_seed(0)
    layer = getattr(bt, config.pop("kind"))(5, 6, dtype=torch.float64, batch_first=True,
                                            **config)
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    lengths = torch.tensor([4, 1, 3]) if with_lengths else None
    plain = _train_call(layer, x, lengths=lengths)
    assert bool(calls) == fast
    for hooks in (torch.autograd.graph.saved_tensors_hooks(_relayout, lambda t: t),
                  torch.autograd.graph.save_on_cpu()):
        with hooks:
            hooked = _train_call(layer, x, lengths=lengths)
        assert all(torch.equal(a, b) for a, b in zip(plain, hooked))


def test_reverse_direction_forward_ops_allocate_only_the_reversed_input():
    """The reverse direction's forward ops reverse the kernels' new h (and cs) in
    place: beyond the forward direction's memory they allocate only x in the op's
    time order (tracemalloc sees NumPy's allocations; h is 80 KB here, over the
    slack, so one more (T, B, H) copy fails this)."""
    import tracemalloc
    T_, B_, I_, H_, P_ = 40, 16, 8, 32, 16
    x = torch.randn(T_, B_, I_)
    h0, c0, hp0 = torch.zeros(B_, H_), torch.zeros(B_, H_), torch.zeros(B_, P_)
    calls = {
        "lstm_op": lambda r: bt.lstm_op(x, h0, c0, torch.randn(4 * H_, I_),
                                        torch.randn(4 * H_, H_), None, None, None, None, None,
                                        None, 0.0, 0.0, r),
        "gru_op": lambda r: bt.gru_op(x, h0, torch.randn(3 * H_, I_), torch.randn(3 * H_, H_),
                                      None, None, None, r),
        "gru_block_op": lambda r: bt.gru_block_op(x, h0, torch.randn(I_ + H_, 2 * H_),
                                                  torch.randn(I_ + H_, H_), None, None, None, r),
        "lstm_proj_op": lambda r: bt.lstm_proj_op(x, hp0, c0, torch.randn(4 * H_, I_),
                                                  torch.randn(4 * H_, P_), None, None,
                                                  torch.randn(P_, H_), None, r),
    }
    slack = 32 * 1024
    for name, call in calls.items():
        peaks = {}
        for reverse in (False, True, False, True):   # the second of each counts
            tracemalloc.start()
            try:
                start = tracemalloc.get_traced_memory()[0]
                call(reverse)
                peaks[reverse] = tracemalloc.get_traced_memory()[1] - start
            finally:
                tracemalloc.stop()
        assert peaks[True] <= peaks[False] + x.numpy().nbytes + slack, (name, peaks)

"""The torch modules' no-grad path (issue 26): the packed inference forward, weights
packed once per cell and cached on the module.

Every check is bit for bit against the same module's grad path (the training ops),
which the no-grad path must reproduce, at every batch size (batch 1 included: the
training ops' batch-1 steps run the same one-row kernel)."""
import copy
import io
import pickle
import threading

import pytest
import torch
from threadpoolctl import threadpool_limits
from torch.nn.utils.rnn import pack_padded_sequence

import blockrnn.torch as bt

T, I, H, B = 7, 20, 37, 3         # H not a multiple of 16: a partial panel
LENGTHS = [T, 0, 3]


def _make(kind, **config):
    torch.manual_seed(0)
    if kind == "lstm":
        return bt.LSTM(I, H, **config)
    if kind == "lstm_extras":
        return bt.LSTM(I, H, use_peephole=True, cell_clip=0.4, forget_bias=0.7, **config)
    return bt.GRU(I, H, reset_after=kind == "gru", **config)


KINDS = ["lstm", "lstm_extras", "gru", "gru_tf"]


def _x(*shape, seed=1, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _flat(out):
    """(y, state) -> [y, h_n(, c_n)] (y's data for a PackedSequence)."""
    y, s = out
    y = y.data if isinstance(y, torch.nn.utils.rnn.PackedSequence) else y
    return [y, *(s if isinstance(s, tuple) else (s,))]


def _equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert not g.requires_grad
        assert torch.equal(g, w), (g - w).abs().max()


def _grad_path(module, *args, **kw):
    """The training ops' answer (grad mode on, the parameters require grad)."""
    assert all(p.requires_grad for p in module.parameters())
    with torch.enable_grad():
        out = module(*args, **kw)
    assert _flat(out)[0].requires_grad
    return [t.detach() for t in _flat(out)]


def _no_grad_paths(module, *args, **kw):
    """The no-grad answers: under torch.no_grad, under inference_mode, and with grad mode
    on but nothing requiring grad."""
    with torch.no_grad():
        yield _flat(module(*args, **kw))
    with torch.inference_mode():
        yield _flat(module(*args, **kw))
    module.requires_grad_(False)
    try:
        yield _flat(module(*args, **kw))
    finally:
        module.requires_grad_(True)


def _state(kind, LD, batch, seed=2):
    parts = [_x(LD, batch, H, seed=seed + k) for k in range(2 if "lstm" in kind else 1)]
    return tuple(parts) if "lstm" in kind else parts[0]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layers,bidirectional", [(1, False), (2, False), (1, True), (2, True)])
@pytest.mark.parametrize("bias", [True, False])
def test_bits_equal_grad_path(kind, layers, bidirectional, bias):
    module = _make(kind, num_layers=layers, bidirectional=bidirectional, bias=bias)
    LD = layers * (2 if bidirectional else 1)
    x = _x(T, B, I)
    for state in (None, _state(kind, LD, B)):
        for lengths in (None, LENGTHS):
            want = _grad_path(module, x, state, sequence_length=lengths)
            for got in _no_grad_paths(module, x, state, sequence_length=lengths):
                _equal(got, want)
    # the no-grad calls ran packed, each cell packed once after each grad call (which
    # drops the cache: see test_in_place_through_data)
    info = module.inference_cache_info()
    assert info["cells"] == LD and info["packings"] == 4 * LD


def _negated_view(t):
    """A tensor equal to t whose negative bit is set (a lazily negated view, as
    ``z.conj().imag`` gives; differentiable)."""
    view = torch.complex(torch.zeros_like(t), -t).conj().imag
    assert view.is_neg() and torch.equal(view, t)
    return view


@pytest.mark.parametrize("kind", KINDS + ["lstm_proj"])
def test_negated_views_compute_their_values(kind):
    """torch's numpy() refuses a tensor with the negative bit set, which nn.LSTM takes:
    as input, state or weight it computes its values, on every path, with gradients."""
    module = (bt.LSTM(I, H, proj_size=5, num_layers=2) if kind == "lstm_proj"
              else _make(kind, num_layers=2))
    x, LD = _x(T, B, I), 2
    state = (_state(kind, LD, B) if kind != "lstm_proj"
             else (_x(LD, B, 5, seed=2), _x(LD, B, H, seed=3)))
    flat = [state] if isinstance(state, torch.Tensor) else list(state)
    negated = [_negated_view(s) for s in flat]
    negated = negated[0] if isinstance(state, torch.Tensor) else tuple(negated)
    want = _grad_path(module, x, state)
    xg = x.clone().requires_grad_()
    _flat(module(xg, state))[0].sum().backward()
    xn = x.clone().requires_grad_()
    got = _flat(module(_negated_view(xn), negated))
    _equal([t.detach() for t in got], want)
    got[0].sum().backward()
    assert torch.equal(xn.grad, xg.grad)
    for got in _no_grad_paths(module, _negated_view(x), negated):
        _equal(got, want)
    param = next(iter(module.parameters()))
    param.data = _negated_view(param.detach().clone())
    _equal(_grad_path(module, x, state), want)
    for got in _no_grad_paths(module, x, state):
        _equal(got, want)


@pytest.mark.parametrize("kind", KINDS)
def test_batch_first_and_packed_sequence(kind):
    module = _make(kind, num_layers=2, bidirectional=True, batch_first=True)
    x = _x(B, T, I)
    want = _grad_path(module, x, sequence_length=LENGTHS)
    for got in _no_grad_paths(module, x, sequence_length=LENGTHS):
        _equal(got, want)
    packed = pack_padded_sequence(x, torch.tensor(LENGTHS[:1] + [2, 3]), batch_first=True,
                                  enforce_sorted=False)
    want = _grad_path(module, packed)
    for got in _no_grad_paths(module, packed):
        _equal(got, want)


@pytest.mark.parametrize("kind", KINDS)
def test_batch_one_bits_equal_grad_path(kind):
    """At batch 1 (and unbatched (T, I) input) the grad path's steps run the inference
    forward's one-row kernel too: the no-grad answer is the grad path's, bit for bit,
    with and without sequence lengths."""
    module = _make(kind, num_layers=2, bidirectional=True)
    x1 = _x(T, 1, I)
    s1 = _state(kind, 4, 1)
    for lengths in (None, [3]):
        want = _grad_path(module, x1, s1, sequence_length=lengths)
        for got in _no_grad_paths(module, x1, s1, sequence_length=lengths):
            _equal(got, want)
    want = _grad_path(module, x1, s1)
    unbatched = tuple(s[:, 0] for s in s1) if isinstance(s1, tuple) else s1[:, 0]
    for got in _no_grad_paths(module, x1[:, 0], unbatched):
        _equal(got, [want[0][:, 0]] + [s[:, 0] for s in want[1:]])


@pytest.mark.parametrize("kind", KINDS)
def test_empty_batch_time_and_zero_lengths(kind):
    module = _make(kind, num_layers=2, bidirectional=True)
    for shape, lengths in (((0, B, I), None), ((T, 0, I), None), ((T, B, I), [0, 0, 0])):
        x = _x(*shape)
        state = _state(kind, 4, shape[1])
        want = _grad_path(module, x, state, sequence_length=lengths)
        for got in _no_grad_paths(module, x, state, sequence_length=lengths):
            _equal(got, want)


def test_bad_input_is_refused_on_the_no_grad_path():
    module = _make("lstm")
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"blockrnn.torch.LSTM: sequence_length entries"):
            module(_x(T, B, I), sequence_length=[T + 1, 1, 1])
        with pytest.raises(ValueError, match=r"sequence_length must have shape"):
            module(_x(T, B, I), sequence_length=[1, 1])
        with pytest.raises(TypeError, match="input has dtype torch.float64"):
            module(_x(T, B, I, dtype=torch.float64))
        with pytest.raises(ValueError, match=r"h0 must have shape"):
            module(_x(T, B, I), (_x(1, B + 1, H), _x(1, B, H)))
    assert module.inference_cache_info()["packings"] == 0   # refused before any packing


@pytest.mark.parametrize("kind", KINDS)
def test_float64_runs_the_training_ops(kind):
    """float64 has no inference kernel yet: no-grad calls run the training ops (the same
    bits), and nothing is packed."""
    module = _make(kind, num_layers=2, bidirectional=True).double()
    x = _x(T, B, I, dtype=torch.float64)
    want = _grad_path(module, x, sequence_length=LENGTHS)
    for got in _no_grad_paths(module, x, sequence_length=LENGTHS):
        _equal(got, want)
    assert module.inference_cache_info() == {"cells": 0, "packings": 0, "nbytes": 0}


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_dropout(kind):
    """eval mode: no dropout, the grad path's bits; training mode under no_grad: the same
    dropout masks as the grad path (the same torch call on the same generator state)."""
    module = _make(kind, num_layers=3, bidirectional=True, dropout=0.5)
    x = _x(T, B, I)
    module.eval()
    want = _grad_path(module, x)
    for got in _no_grad_paths(module, x):
        _equal(got, want)
    module.train()
    torch.manual_seed(11)
    want = _grad_path(module, x)
    for ctx in (torch.no_grad, torch.inference_mode):
        torch.manual_seed(11)
        with ctx():
            _equal(_flat(module(x)), want)
    torch.manual_seed(12)
    with torch.no_grad():
        assert not torch.equal(_flat(module(x))[0], want[0])   # the masks do apply


# ---------------------------------------------------------------------------
# The cache: packed once, never stale
# ---------------------------------------------------------------------------

def test_second_call_does_no_packing_and_updates_repack():
    module = _make("lstm", num_layers=2, bidirectional=True)
    x = _x(T, B, I)
    with torch.no_grad():
        module(x)
        assert module.inference_cache_info()["packings"] == 4
        module(x)
        module(x[:3, :2])                     # other shapes reuse the packed weights
        assert module.inference_cache_info()["packings"] == 4
        module.weight_hh_l1_reverse.add_(0.01)
        module(x)
        assert module.inference_cache_info()["packings"] == 5   # that one cell only
        module(x)
        assert module.inference_cache_info()["packings"] == 5
    info = module.inference_cache_info()
    assert info["cells"] == 4
    # the stated memory: the packed copies (>= the weights' own bytes; W_hh twice, as
    # panels and in the one-row kernel's wide layout), nothing else
    weights = sum(p.numel() * 4 for p in module.parameters())
    assert weights <= info["nbytes"] <= 2 * weights
    assert not any("cache" in k or "packed" in k for k in module.state_dict())
    assert not list(module.buffers())


def _update_in_place(module, opt):
    with torch.no_grad():
        next(module.parameters()).mul_(0.5)     # weight_ih_l0 (w_ru_l0)


def _update_load_state_dict(module, opt):
    sd = {k: v * 0.5 for k, v in module.state_dict().items()}
    module.load_state_dict(sd)


def _update_double_float(module, opt):
    with torch.no_grad():
        module.double()
        list(module.parameters())[1].mul_(0.5)   # while float64; new float32 tensors follow
    module.float()


def _update_optimizer_step(module, opt):
    # gradients set by hand: no forward in between (which would drop the cache anyway)
    for p in module.parameters():
        p.grad = torch.full_like(p, 0.1)
    opt.step()


UPDATES = [_update_in_place, _update_load_state_dict, _update_double_float,
           _update_optimizer_step]


@pytest.mark.parametrize("update", UPDATES, ids=lambda f: f.__name__[8:])
@pytest.mark.parametrize("kind", ["lstm", "gru", "gru_tf"])
def test_stale_weights_never_served(kind, update):
    module = _make(kind, num_layers=2)
    opt = torch.optim.SGD(module.parameters(), lr=0.5)
    x = _x(T, B, I)
    with torch.no_grad():
        old = _flat(module(x))
    update(module, opt)
    with torch.no_grad():
        new = _flat(module(x))
    assert not torch.equal(new[0], old[0])
    _equal(new, _grad_path(module, x))


def test_in_place_through_data():
    """``p.data`` changes bypass the version counter: a forward that records a graph drops
    the cache (a hand-written SGD loop is served fresh weights), clear_inference_cache
    drops it by hand."""
    module = _make("lstm")
    x = _x(T, B, I)
    with torch.no_grad():
        module(x)
    y, _ = module(x)                           # grad path: drops the cache
    y.sum().backward()
    for p in module.parameters():
        p.data.add_(p.grad, alpha=-0.5)        # word_language_model's update
    with torch.no_grad():
        _equal(_flat(module(x)), _grad_path(module, x))
    module.weight_hh_l0.data.mul_(0.5)         # no graph in between: clear by hand
    module.clear_inference_cache()
    with torch.no_grad():
        _equal(_flat(module(x)), _grad_path(module, x))


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_parametrized_weight(kind):
    """A parametrization (weight_norm) computes its weight at each access, a new tensor
    with no version to key on: that cell is packed at each no-grad call and never cached
    (the others are), every answer equals the grad path's, an update of the
    parametrization's own parameters is served at once. With only those trainable, a
    call in grad mode records a graph and they get nn's gradients."""
    from torch.nn.utils.parametrizations import weight_norm
    module = _make(kind, num_layers=2)
    ref = (torch.nn.LSTM if kind == "lstm" else torch.nn.GRU)(I, H, num_layers=2)
    ref.load_state_dict(module.state_dict())
    name = "weight_hh_l1" if kind == "lstm" else "weight_ih_l1"
    x = _x(T, B, I)
    with torch.no_grad():
        module(x)                                # both cells cached, then
    for m in (module, ref):
        weight_norm(m, name)
    for _ in range(2):
        want = _grad_path(module, x)
        for got in _no_grad_paths(module, x):
            _equal(got, want)
        with torch.no_grad():
            module(x)
            before = module.inference_cache_info()["packings"]
            module(x)
            module(x)
            torch.testing.assert_close(module(x)[0], ref(x)[0], rtol=1e-5, atol=1e-5)
            for m in (module, ref):
                getattr(m.parametrizations, name).original0.mul_(1.5)
        info = module.inference_cache_info()
        assert info["cells"] == 1 and info["packings"] == before + 3
    for m in (module, ref):
        for n, p in m.named_parameters():
            p.requires_grad_(n.startswith("parametrizations."))
    y = module(x)[0]
    assert y.grad_fn is not None
    y.sum().backward()
    ref(x)[0].sum().backward()
    for n, p in module.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(p.grad, dict(ref.named_parameters())[n].grad,
                                       rtol=1e-4, atol=1e-5)
    single = _make(kind)                         # no cell cached: packings still counted
    weight_norm(single, "weight_hh_l0")
    with torch.no_grad():
        single(x)
        single(x)
    assert single.inference_cache_info() == {"cells": 0, "packings": 2, "nbytes": 0}


def test_pruned_weight():
    """torch.nn.utils.prune makes the weight a plain tensor attribute recomputed by a
    hook (the parameter becomes weight_orig): packed per no-grad call, bit for bit the
    grad path's; after prune.remove it is a parameter again and cached."""
    import torch.nn.utils.prune as prune
    module = _make("lstm", num_layers=2)
    x = _x(T, B, I)
    prune.l1_unstructured(module, "weight_hh_l0", 0.5)
    want = _grad_path(module, x)
    for got in _no_grad_paths(module, x):
        _equal(got, want)
    assert module.inference_cache_info()["cells"] == 1
    prune.remove(module, "weight_hh_l0")
    with torch.no_grad():
        _equal(_flat(module(x)), want)
    assert module.inference_cache_info()["cells"] == 2


def test_option_changes_repack():
    module = _make("lstm_extras")
    x = _x(T, B, I)
    with torch.no_grad():
        module(x)
    for name, value in (("forget_bias", 0.1), ("cell_clip", 0.2), ("use_peephole", False)):
        setattr(module, name, value)
        with torch.no_grad():
            got = _flat(module(x))
        _equal(got, _grad_path(module, x))


def test_copies_and_pickles_of_a_module():
    module = _make("gru", num_layers=2, bidirectional=True)
    x = _x(T, B, I)
    with torch.no_grad():
        want = _flat(module(x))
    buf = io.BytesIO()
    torch.save(module, buf)
    buf.seek(0)
    for other in (copy.deepcopy(module), pickle.loads(pickle.dumps(module)),
                  torch.load(buf, weights_only=False)):
        assert other.inference_cache_info()["cells"] == 0
        with torch.no_grad():
            _equal(_flat(other(x)), want)
        with torch.no_grad():
            other.weight_ih_l0.zero_()          # the copy's weights only
    with torch.no_grad():
        _equal(_flat(module(x)), want)


# ---------------------------------------------------------------------------
# Threads
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_thread_counts_give_the_same_bits(kind):
    module = _make(kind, num_layers=2, bidirectional=True)
    x = _x(T, 8, I)
    want = _grad_path(module, x, sequence_length=[T, 0, 3, 5, 1, T, 2, 4])
    for n in (1, 2):
        with threadpool_limits(n, user_api="openmp"), torch.no_grad():
            _equal(_flat(module(x, sequence_length=[T, 0, 3, 5, 1, T, 2, 4])), want)


@pytest.mark.parametrize("kind", KINDS)
def test_concurrent_callers_share_one_module(kind):
    """Two Python threads call one module under no_grad (each thread its own grad mode),
    the first call of each racing to pack: every answer has the serial bits."""
    module = _make(kind, num_layers=2, bidirectional=True)
    xs = [_x(T, b, I, seed=20 + b) for b in (2, 5)]
    wants = [_grad_path(module, x) for x in xs]
    errors = []
    start = threading.Barrier(2)

    def work(i):
        try:
            start.wait()
            for _ in range(10):
                with torch.inference_mode() if i else torch.no_grad():
                    _equal(_flat(module(xs[i])), wants[i])
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert module.inference_cache_info()["cells"] == 4


# ---------------------------------------------------------------------------
# Tracing: the training ops, never the cache
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["lstm", "gru_tf"])
def test_compile_under_no_grad_uses_the_training_ops(kind):
    torch._dynamo.reset()
    module = _make(kind, num_layers=2, bidirectional=True)
    x = _x(T, B, I)
    lengths = torch.tensor(LENGTHS)
    compiled = torch.compile(lambda x, n: module(x, sequence_length=n), fullgraph=True)
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            got = _flat(compiled(x, lengths))
        _equal(got, _grad_path(module, x, sequence_length=lengths))
    assert module.inference_cache_info()["packings"] == 0
    with torch.no_grad():
        program = torch.export.export(module, (x,), {"sequence_length": lengths})
    assert any("blockrnn" in str(n.target) for n in program.graph.nodes
               if n.op == "call_function")
    assert module.inference_cache_info()["packings"] == 0
    with torch.no_grad():
        _equal(_flat(program.module()(x, sequence_length=lengths)),
               _grad_path(module, x, sequence_length=lengths))

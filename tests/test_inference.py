"""The inference forward (issue 26): weights packed once, only y and the final states.

Every check is bit for bit against the training forward (the sequence ops and the
layers' forward), since the inference kernel computes the same sums in the same
order and the same gate row functions."""
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from numpy.testing import assert_array_equal
from threadpoolctl import threadpool_limits
from _inputs import check_kernel_variant

import blockrnn
from blockrnn import _kernels
from blockrnn.layers import _last

T, I, H = 7, 20, 37          # H not a multiple of 16: a partial panel
IFCO, ICFO = int(_kernels.GateLayout.IFCO), int(_kernels.GateLayout.ICFO)
LENGTHS = {None: None, "0,1,T": np.array([0, 1, T])}


def _rand(rng, shape, dtype=np.float32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def _lstm_case(dtype, B=3, seed=0):
    rng = np.random.default_rng(seed)
    return dict(x=_rand(rng, (T, B, I), dtype), h0=_rand(rng, (B, H), dtype),
                c0=_rand(rng, (B, H), dtype), w=_rand(rng, (I + H, 4 * H), dtype, 0.3),
                b=_rand(rng, (4 * H,), dtype), peep=[_rand(rng, (H,), dtype) for _ in range(3)])


def _lstm_training(case, layout, peep, clip, lengths):
    """The training forward's y, h_n, c_n (block_lstm / block_lstm_v2 + _last)."""
    kw = dict(cell_clip=clip, use_peephole=peep, sequence_length=lengths)
    if layout == ICFO:
        op, kw["forget_bias"] = blockrnn.block_lstm, 0.7
    else:
        op = blockrnn.block_lstm_v2
    out = op(T, case["x"], case["c0"], case["h0"], case["w"], *case["peep"], case["b"], **kw)
    return out.h, _last(out.h, case["h0"], lengths), _last(out.cs, case["c0"], lengths)


def _lstm_packed(case, layout, peep, clip):
    return _kernels.PackedLSTMWeights(
        case["w"][:I], case["w"][I:], case["b"], *case["peep"], layout=layout,
        forget_bias=0.7 if layout == ICFO else 0.0, cell_clip=clip, use_peephole=peep,
        work_per_thread=0)   # one thread per 16-cell panel, however small the step


def _equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("lengths", list(LENGTHS))
@pytest.mark.parametrize("peep,clip", [(False, 0.0), (True, 0.5)])
@pytest.mark.parametrize("layout", [IFCO, ICFO])
def test_lstm_bits_equal_training_forward(layout, peep, clip, lengths, dtype):
    case = _lstm_case(dtype)
    want = _lstm_training(case, layout, peep, clip, LENGTHS[lengths])
    packed = _lstm_packed(case, layout, peep, clip)
    for n in (1, 2, 3, 4):
        with threadpool_limits(n, user_api="openmp"):
            got = packed.forward(case["x"], case["h0"], case["c0"], LENGTHS[lengths])
        _equal(got, want)


def _gru_case(dtype, reset_after, B=3, seed=1):
    rng = np.random.default_rng(seed)
    if reset_after:
        w = (_rand(rng, (3 * H, I), dtype, 0.3), _rand(rng, (3 * H, H), dtype, 0.3),
             _rand(rng, (3 * H,), dtype), _rand(rng, (3 * H,), dtype))
    else:
        w = (_rand(rng, (I + H, 2 * H), dtype, 0.3), _rand(rng, (I + H, H), dtype, 0.3),
             _rand(rng, (2 * H,), dtype), _rand(rng, (H,), dtype))
    return dict(x=_rand(rng, (T, B, I), dtype), h0=_rand(rng, (B, H), dtype), w=w)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("lengths", list(LENGTHS))
@pytest.mark.parametrize("reset_after", [False, True])
def test_gru_bits_equal_training_forward(reset_after, lengths, dtype):
    case = _gru_case(dtype, reset_after)
    op = blockrnn.block_gru_reset_after if reset_after else blockrnn.block_gru
    cls = _kernels.PackedGRUResetAfterWeights if reset_after else _kernels.PackedGRUWeights
    out = op(T, case["x"], case["h0"], *case["w"], sequence_length=LENGTHS[lengths])
    want = out.h, _last(out.h, case["h0"], LENGTHS[lengths])
    packed = cls(*case["w"], work_per_thread=0)
    for n in (1, 2, 3, 4):
        with threadpool_limits(n, user_api="openmp"):
            got = packed.forward(case["x"], case["h0"], LENGTHS[lengths])
        _equal(got, want)


@pytest.mark.parametrize("lengths", [None, "3"])
def test_batch_one_bits_equal_training_forward(lengths):
    """At batch 1 the training forwards run their steps' recurrent products by the
    inference forward's one-row kernel (include/brnn_inference.h), their input
    projection hoisted: the inference forward equals them bit for bit, at any thread
    count of either."""
    lens = None if lengths is None else np.array([3])
    for layout, peep, clip in ((IFCO, True, 0.0), (ICFO, False, 0.5)):
        case = _lstm_case(np.float32, B=1)
        want = _lstm_training(case, layout, peep, clip, lens)
        packed = _lstm_packed(case, layout, peep, clip)
        for n in (1, 2, 3, 4):
            with threadpool_limits(n, user_api="openmp"):
                _equal(packed.forward(case["x"], case["h0"], case["c0"], lens), want)
                _equal(_lstm_training(case, layout, peep, clip, lens), want)
    for reset_after in (False, True):
        g = _gru_case(np.float32, reset_after, B=1)
        op = blockrnn.block_gru_reset_after if reset_after else blockrnn.block_gru
        cls = _kernels.PackedGRUResetAfterWeights if reset_after else _kernels.PackedGRUWeights
        out = op(T, g["x"], g["h0"], *g["w"], sequence_length=lens)
        want = out.h, _last(out.h, g["h0"], lens)
        packed = cls(*g["w"], work_per_thread=0)
        for n in (1, 2, 3, 4):
            with threadpool_limits(n, user_api="openmp"):
                _equal(packed.forward(g["x"], g["h0"], lens), want)


def test_lstm_nn_layout_packs_the_same_weights():
    """nn.LSTM's weight_ih [4H, I], weight_hh [4H, H] (gates i, f, g, o = IFCO),
    packed from their strides, give TF's layout's answer [I+H, 4H] = their
    transposes stacked."""
    for B in (3, 1):   # batch 1: W_h gate-interleaved from either layout
        case = _lstm_case(np.float32, B=B)
        w_ih = np.ascontiguousarray(case["w"][:I].T)
        w_hh = np.ascontiguousarray(case["w"][I:].T)
        tf = _lstm_packed(case, IFCO, False, 0.0)
        nn = _kernels.PackedLSTMWeights(w_ih, w_hh, case["b"], gates_in_rows=True)
        _equal(nn.forward(case["x"], case["h0"], case["c0"]),
               tf.forward(case["x"], case["h0"], case["c0"]))


@pytest.mark.parametrize("threads", [1, 2])
def test_batch_one_without_the_hoisted_projection_keeps_the_bits(threads):
    """At batch 1 a sequence whose input projection of all steps exceeds the hoisting
    buffer (L * G floats over 2**22, G = 4H / 3H) computes x[t] @ W_x inside each step,
    before the panels of the fused step: the training forward's bits still."""
    I_, H_ = 3, 130
    rng = np.random.default_rng(22)
    for layer, T_ in ((blockrnn.LSTM(I_, H_, seed=3, use_peephole=True), 8200),
                      (blockrnn.GRU(I_, H_, seed=3), 10800)):
        x = _rand(rng, (T_, 1, I_))
        with threadpool_limits(threads, user_api="openmp"):
            y, s, _ = layer.forward(x)
            y2, s2 = layer.inference()(x)
        _equal((y2, *_states(s2)), (y, *_states(s)))


LAYERS = [
    ("lstm", lambda dt: blockrnn.LSTM(I, H, 2, bidirectional=True, use_peephole=True,
                                      cell_clip=1.5, dtype=dt, seed=3)),
    ("gru", lambda dt: blockrnn.GRU(I, H, 2, bidirectional=True, dtype=dt, seed=4)),
    ("gru_tf", lambda dt: blockrnn.GRU(I, H, 2, bidirectional=True, reset_after=False,
                                       dtype=dt, seed=5)),
]


def _states(state):
    return state if isinstance(state, tuple) else (state,)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,make", LAYERS)
def test_layers_stacked_bidirectional(name, make, dtype):
    layer = make(dtype)
    infer = layer.inference()
    rng = np.random.default_rng(6)
    x = _rand(rng, (T, 3, I), dtype)
    state = tuple(_rand(rng, (4, 3, H), dtype) for _ in range(2 if name == "lstm" else 1))
    state = state if name == "lstm" else state[0]
    for lengths in LENGTHS.values():
        y, s, _ = layer.forward(x, state, lengths)
        y2, s2 = infer(x, state, lengths)
        _equal((y2, *_states(s2)), (y, *_states(s)))
    assert infer.nbytes > 0


@pytest.mark.parametrize("name,make", LAYERS)
def test_stale_weights_never_served(name, make):
    layer = make(np.float32)
    x = _rand(np.random.default_rng(7), (T, 2, I))
    old = layer.inference()
    y_old, _ = old(x)
    for p in layer.params.values():
        p *= 0.5                                  # in place
    y_new_layer, _, _ = layer.forward(x)
    np.testing.assert_array_equal(old(x)[0], y_old)       # the old copy
    np.testing.assert_array_equal(layer.inference()(x)[0], y_new_layer)
    assert not np.array_equal(y_old, y_new_layer)


def test_calls_never_repack():
    layer = blockrnn.LSTM(I, H, 2, bidirectional=True, seed=8)
    infer = layer.inference()
    assert infer.packings == 4                    # one per layer and direction
    addresses = [r.packed_address for r in infer._runs]
    x = _rand(np.random.default_rng(9), (T, 2, I))
    infer(x)
    infer(x)
    assert infer.packings == 4
    assert [r.packed_address for r in infer._runs] == addresses


def test_inference_thread_rule_and_a_concurrent_caller():
    """The default rule (INFER_WORK_PER_THREAD = 12288 multiply-adds of a step per
    thread): batch 1 takes 2 threads from H = 96 and stays on one at H = 64, batch 8
    takes 2 from H = 64; work_per_thread=2^20 keeps all of those on one. A request
    running while another caller holds a thread is granted 1 of 2."""
    want = _kernels.inference_threads_for
    for G in (4, 3):
        assert want(64, 1, 64, 64, G * 64, 2) == 1
        for H in (96, 128, 256):
            assert want(64, 1, H, H, G * H, 2) == 2
            assert want(64, 1, H, H, G * H, 2, 1 << 20) == 1
        assert want(64, 8, 64, 64, G * 64, 2) == 2
        assert want(64, 8, 128, 128, G * 128, 2, 1 << 20) == 1
    assert want(64, 1, 256, 256, 4 * 256, 1) == 1                # max_threads caps it
    held = _kernels.thread_budget_take(1, 2)             # a concurrent caller's own thread
    try:
        assert held == 1
        got = _kernels.thread_budget_take(want(64, 1, 256, 256, 4 * 256, 2), 2)
        assert got == 1
        _kernels.thread_budget_give(got)
    finally:
        _kernels.thread_budget_give(held)
    assert _kernels.thread_budget_in_use() == 0


@pytest.mark.parametrize("name,make", LAYERS)
def test_calls_split_by_rows_keep_the_bits(name, make):
    """From 4 rows a thread (split_rows) a call splits its batch rows between its
    threads, with no barrier in the time loop: y and the final states are still the
    training forward's at 1-4 threads, with and without lengths (rows of length 0 and
    T in the first and the last thread's block), the input projection hoisted (B < 12)
    or in each step."""
    split = _kernels.split_rows_for
    assert split(8, 2) and split(16, 4) and split(64, 2)
    assert not split(7, 2) and not split(15, 4) and not split(64, 1)
    layer = make(np.float32)
    infer = type(layer.inference())(layer, work_per_thread=0, idle_ns=0)  # threads at any size
    rng = np.random.default_rng(12)
    for B in (8, 9, 13, 16):
        x = _rand(rng, (T, B, I))
        lens = rng.integers(0, T + 1, B)
        lens[0], lens[-1] = 0, T
        for lengths in (None, lens):
            y, s, _ = layer.forward(x, sequence_length=lengths)
            for n in (1, 2, 3, 4):
                with threadpool_limits(n, user_api="openmp"):
                    y2, s2 = infer(x, sequence_length=lengths)
                _equal((y2, *_states(s2)), (y, *_states(s)))
    assert _kernels.thread_budget_in_use() == 0


SHED_LAYERS = [("lstm", lambda: blockrnn.LSTM(64, 256, seed=3)),
               ("gru", lambda: blockrnn.GRU(64, 256, seed=3)),
               ("tf-gru", lambda: blockrnn.GRU(64, 256, reset_after=False, seed=3))]


@pytest.mark.parametrize("B", [1, 8])
@pytest.mark.parametrize("name,make", SHED_LAYERS)
def test_two_callers_shed_the_extra_thread_and_keep_the_bits(name, make, B):
    """Batch 1 and 8 at H = 256 ask for 2 threads. When a second caller starts while
    a call holds both, it is granted its own thread beyond the budget, and the first
    call gives its extra thread back at the end of its step (batch 1, split by cells:
    brnn_barrier_wait_shed; batch 8, split by rows: infer_split_part, the caller then
    runs the rest of the other thread's rows): the sheds are counted, every answer
    keeps the serial bits, the budget ends at 0."""
    layer = make()
    infer = type(layer.inference())(layer, idle_ns=0)
    x = np.random.default_rng(4).standard_normal((48, B, 64)).astype(np.float32)
    want = infer(x)[0]
    with threadpool_limits(1, user_api="openmp"):
        assert_equal = np.testing.assert_array_equal
        assert_equal(infer(x)[0], want)                 # one thread: the same bits
    stop, errors = threading.Event(), []

    def work():
        try:
            while not stop.is_set():
                assert_equal(infer(x)[0], want)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while infer.sheds == 0 and time.monotonic() < deadline and not stop.is_set():
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors
    assert infer.sheds > 0
    assert _kernels.thread_budget_in_use() == 0


_PARTNER_SCRIPT = """
import os, subprocess, sys, time
import numpy as np
import blockrnn
from blockrnn import _kernels
# a busy process per usable CPU: a call's second thread is time-sliced with them
hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in os.sched_getaffinity(0)]
try:
    layer = blockrnn.%s
    infer = type(layer.inference())(layer, idle_ns=0)
    run = infer._runs[0]
    x = np.random.default_rng(4).standard_normal((48, 1, 64)).astype(np.float32)
    ref = run.forward(x, max_threads=1)[0]
    deadline = time.monotonic() + 30
    while not run.solo and time.monotonic() < deadline:
        np.testing.assert_array_equal(infer(x)[0], ref)
    assert run.solo and infer.sheds > 0, (run.solo, infer.sheds)
    np.testing.assert_array_equal(infer(x)[0], ref)   # now on one thread
    assert _kernels.thread_budget_in_use() == 0
finally:
    for hog in hogs:
        hog.kill()
print("ok")
"""


@pytest.mark.parametrize("layer", ["LSTM(64, 256, seed=3)", "GRU(64, 256, seed=3)",
                                   "GRU(64, 256, reset_after=False, seed=3)"])
def test_a_partner_thread_that_is_not_running_is_shed(layer):
    """A fresh process beside a busy process on every CPU: a call's second thread is
    time-sliced with them, a barrier waits over 1 ms, the call sheds that thread and
    the object runs on one thread for a while (`solo`); the answers keep the
    one-thread bits throughout."""
    out = subprocess.run([sys.executable, "-c", _PARTNER_SCRIPT % layer],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


@pytest.mark.parametrize("name,make", SHED_LAYERS)
def test_a_small_call_after_an_idle_spell_runs_alone(name, make):
    """A call of fewer than INFER_IDLE_WORK multiply-adds asks for one thread when its
    object's last call ended more than idle_ns ago (or never): its partner thread's core
    may be halted; the next call, right after, asks for 2. idle_ns=0 never does this,
    and a large call asks for 2 after any spell. Same bits throughout."""
    assert _kernels.openmp_max_threads() >= 2, "this test needs 2 OpenMP threads"
    layer = make()
    x = np.random.default_rng(6).standard_normal((48, 1, 64)).astype(np.float32)
    default = layer.inference()
    assert default._runs[0].idle_ns == 200_000
    # A spell of 50 ms, not the default's 200 us: between two calls of this test the
    # interpreter alone can take over 200 us (seen under ASan with PYTHONMALLOC=malloc
    # on a CI machine), and a VM's host can pause a CPU for a few ms.
    infer = type(default)(layer, idle_ns=50_000_000)
    run = infer._runs[0]
    want = infer(x)[0]
    assert run.last_threads == 1 and run.last_plan == "idle"   # never called before
    np.testing.assert_array_equal(infer(x)[0], want)
    assert run.last_threads == 2 == infer.last_threads     # right after the last one
    time.sleep(0.1)
    np.testing.assert_array_equal(infer(x)[0], want)
    assert run.last_threads == 1 and run.last_plan == "idle"   # after 100 ms idle
    always = type(infer)(layer, idle_ns=0)
    np.testing.assert_array_equal(always(x)[0], want)
    assert always._runs[0].last_threads == 2
    big = np.random.default_rng(6).standard_normal((48, 12, 64)).astype(np.float32)
    infer(big)                                         # 48*12*320*G >= 3 * 2^25
    time.sleep(0.01)
    run._set_pace(0, 0)    # no solo spell: a call above that found its 2 threads on one
    infer(big)             # CPU (brnn_barrier_wait_shed) must not decide this one
    assert run.last_threads == 2


@pytest.mark.parametrize("name,make", SHED_LAYERS)
def test_small_calls_ask_for_what_they_measured_faster(name, make):
    """Back-to-back small calls ask for 2 threads unless this object's calls measured 2
    slower than one per multiply-add (brnn_pace: e.g. another process holds the partner's
    core): then one, with a try of 2 for 12 ms every 200 ms. While 2 are faster, every
    64th call asks for one (every 256th while one measured over twice as slow: tested
    on the pace itself, below). A 2-thread call is timed only once its run of 2-thread calls
    has lasted 8 ms (a core that sat idle starts slowly). Same bits whichever the choice;
    idle_ns=0 turns the pace off."""
    assert _kernels.openmp_max_threads() >= 2, "this test needs 2 OpenMP threads"
    layer = make()
    x = np.random.default_rng(6).standard_normal((48, 1, 64)).astype(np.float32)
    infer = type(layer.inference())(layer, idle_ns=10**9)   # no idle spell within the test
    run = infer._runs[0]
    want = infer(x)[0]                       # the first call: idle, alone, not timed
    assert run.last_threads == 1 and run.pace_fs_per_mac == (0, 0)

    def calls(n):
        """The threads asked by the next n calls that the pace planned: a call
        whose 2 threads met on one CPU (brnn_barrier_wait_shed; a loaded host)
        makes the object solo for a spell, and the calls of the spell (planned
        "solo", never by the pace) are not counted."""
        got = []
        while len(got) < n:
            np.testing.assert_array_equal(infer(x)[0], want)
            if run.last_plan == "pace":
                got.append(run.last_threads)
            else:
                assert run.last_plan == "solo" and run.last_threads == 1, run.last_plan
        return got

    def planned(one, many, run_calls, retry_in_ns=10**12):
        """run_calls() after setting the pace's means. With a try of 2 threads due
        (retry_in_ns=0), again (for up to 60 s) if a call shed meanwhile: its solo
        spell also ends the try."""
        deadline = time.monotonic() + 60
        while True:
            run._set_pace(one, many, retry_in_ns)
            sheds = run.sheds
            got = run_calls()
            if retry_in_ns or run.sheds == sheds or time.monotonic() > deadline:
                return got

    deadline = time.monotonic() + 30   # (a call that sheds pauses the pace: solo)
    while 0 in run.pace_fs_per_mac and time.monotonic() < deadline:
        np.testing.assert_array_equal(infer(x)[0], want)
    # both choices measured; unless a busy process kept stalling the partner (every run
    # of 2-thread calls shed into a solo spell before it lasted 8 ms)
    assert 0 not in run.pace_fs_per_mac or run.sheds > 0, (run.pace_fs_per_mac, run.sheds)

    # several threads measured faster: the 64th call probes one thread (the 256th
    # while one thread measured over twice as slow: test_the_probe_is_rarer_...)
    assert planned(3, 2, lambda: calls(64)) == [2] * 63 + [1]
    # several threads measured slower, no try due: one thread
    assert planned(1, 10**15, lambda: calls(16)) == [1] * 16

    def a_try():   # 2 threads for 12 ms, then one again: 2 threads still slower
        first = calls(2)
        time.sleep(0.015)
        return first + calls(2)
    assert planned(1, 10**15, a_try, retry_in_ns=0) == [2, 2, 1, 1]
    one, many = run.pace_fs_per_mac
    assert many > one
    off = type(infer)(layer, idle_ns=0)
    off(x)
    off._runs[0]._set_pace(1, 10**15)
    np.testing.assert_array_equal(off(x)[0], want)
    assert off._runs[0].last_threads == 2 and off._runs[0].pace_fs_per_mac == (1, 10**15)
    assert off._runs[0].last_plan == "size"


def test_packed_weights_start_on_a_cache_line():
    """The one-row kernel loads a 64-byte panel row per FMA: packed weights off a
    cache line would split every load (1.5x slower measured at H=128, 256)."""
    for H_ in (H, 128, 600):
        for layer in (blockrnn.LSTM(I, H_, seed=1), blockrnn.GRU(I, H_, seed=1),
                      blockrnn.GRU(I, H_, reset_after=False, seed=1)):
            for r in layer.inference()._runs:
                assert r.packed_address % 64 == 0


@pytest.mark.parametrize("name,make", LAYERS)
def test_concurrent_callers_get_the_serial_bits(name, make):
    layer = make(np.float32)
    infer = type(layer.inference())(layer, work_per_thread=0, idle_ns=0)   # threads at any size
    rng = np.random.default_rng(10)
    xs = [_rand(rng, (T, b, I)) for b in (1, 2, 3, 8)]
    want = [infer(x)[0] for x in xs]
    results, errors = {}, []

    def work(i):
        try:
            for _ in range(5):
                results[i] = infer(xs[i])[0]
                np.testing.assert_array_equal(results[i], want[i])
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert _kernels.thread_budget_in_use() == 0


def test_bad_input():
    layer = blockrnn.LSTM(I, H, seed=11)
    infer = layer.inference()
    x = np.zeros((T, 2, I), np.float32)
    with pytest.raises(ValueError, match="x must have shape"):
        infer(np.zeros((T, 2, I + 1), np.float32))
    with pytest.raises(TypeError, match="x must have dtype float32"):
        infer(x.astype(np.float64))
    with pytest.raises(ValueError, match=r"state\[0\] \(h\) must have shape"):
        infer(x, (np.zeros((1, 3, H), np.float32), None))
    with pytest.raises(ValueError, match="sequence_length"):
        infer(x, None, [1, T + 1])
    with pytest.raises(ValueError, match="max_threads"):
        layer.inference(max_threads=0)
    with pytest.raises(ValueError, match=r"^LSTMInference: x must have shape \(\?, \?, 20\), "
                                         r"got \(7, 20\)"):
        infer(np.zeros((T, I), np.float32))   # the one-run fast path names the object too
    packed = infer._runs[0]
    with pytest.raises(ValueError, match="x must have shape"):
        packed.forward(np.zeros((T, I), np.float32))
    with pytest.raises(TypeError, match="h0 must have x's dtype"):
        packed.forward(x, np.zeros((2, H), np.float64))
    with pytest.raises(ValueError, match="c0 must have shape"):
        packed.forward(x, None, np.zeros((3, H), np.float32))
    with pytest.raises(ValueError, match="sequence_length must be in"):
        packed.forward(x, None, None, np.array([-1, 2]))
    with pytest.raises(TypeError, match="w_x must be a 2-D float32"):
        _kernels.PackedLSTMWeights(np.zeros((I, 4 * H)), np.zeros((H, 4 * H), np.float32),
                                   np.zeros(4 * H, np.float32))
    with pytest.raises(ValueError, match="w_h must have shape"):
        _kernels.PackedLSTMWeights(np.zeros((I, 4 * H), np.float32),
                                   np.zeros((H + 1, 4 * H), np.float32),
                                   np.zeros(4 * H, np.float32))


def test_empty_batch_and_time():
    packed = blockrnn.GRU(I, H, seed=12).inference()._runs[0]
    h0 = np.ones((2, H), np.float32)
    y, h_n = packed.forward(np.zeros((0, 2, I), np.float32), h0)
    assert y.shape == (0, 2, H)
    np.testing.assert_array_equal(h_n, h0)
    y, h_n = packed.forward(np.zeros((T, 0, I), np.float32))
    assert y.shape == (T, 0, H) and h_n.shape == (0, H)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["lstm", "gru", "gru_tf"])
def test_one_layer_fast_path(kind, dtype):
    """One layer and direction (the call that skips the state copies), batch 1 and 3."""
    layer = (blockrnn.LSTM(I, H, dtype=dtype, seed=13) if kind == "lstm" else
             blockrnn.GRU(I, H, reset_after=kind == "gru", dtype=dtype, seed=13))
    infer = layer.inference()
    rng = np.random.default_rng(14)
    for B in (3, 1):
        x = _rand(rng, (T, B, I), dtype)
        parts = tuple(_rand(rng, (1, B, H), dtype) for _ in range(2 if kind == "lstm" else 1))
        for state in (None, parts if kind == "lstm" else parts[0]):
            for lengths in ([None, np.array([0, 1, T])] if B == 3 else [None, [1]]):
                y, s, _ = layer.forward(x, state, lengths)
                y2, s2 = infer(x, state, lengths)
                _equal((y2, *_states(s2)), (y, *_states(s)))


def test_packed_forward_input_forms():
    """None states read zeros; a strided or non-native x takes the checked path and
    gives the same bits as the C-contiguous float32 one."""
    case = _lstm_case(np.float32)
    packed = _lstm_packed(case, IFCO, True, 0.0)
    zeros = np.zeros_like(case["h0"])
    x = case["x"]
    want = packed.forward(x, zeros, zeros)
    _equal(packed.forward(x), want)
    _equal(packed.forward(x, None, zeros), want)
    wide = np.zeros((T, 3, 2 * I), np.float32)
    wide[:, :, ::2] = x
    _equal(packed.forward(wide[:, :, ::2]), want)
    _equal(packed.forward(x.astype(">f4")), want)
    with pytest.raises(TypeError, match="x must have dtype float32"):
        packed.forward(x.tolist())               # a list has no dtype: float64
    g = blockrnn.GRU(I, H, seed=15).inference()._runs[0]
    _equal(g.forward(x), g.forward(x, np.zeros((3, H), np.float32)))


_VARIANT_CHECK = r'''
import sys, numpy as np, blockrnn
assert blockrnn._kernels.packed_kernel_name() == sys.argv[1]
rng = np.random.default_rng(0)
for T, B, I, H in [(7, 1, 24, 200), (5, 3, 40, 37), (6, 8, 16, 130)]:
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    lens = rng.integers(0, T + 1, B)
    for layer in (blockrnn.LSTM(I, H, seed=1), blockrnn.GRU(I, H, seed=1),
                  blockrnn.GRU(I, H, seed=1, reset_after=False)):
        y, st, _ = layer.forward(x, sequence_length=lens)
        yi, sti = layer.inference()(x, sequence_length=lens)
        np.testing.assert_array_equal(yi, y)
        for a, b in zip(sti if isinstance(sti, tuple) else (sti,),
                        st if isinstance(st, tuple) else (st,)):
            np.testing.assert_array_equal(a, b)
print("ok")
'''


@pytest.mark.parametrize("variant", ["avx512", "avx2", "portable"])
def test_every_kernel_variant_serves_the_forward(variant):
    """The inference kernels of each packed-kernel variant this CPU runs (the one-row
    kernels of include/brnn_inference.h included) give the training forward's answer;
    a variant the CPU lacks is refused at import, which tests/test_packed.py checks."""
    check_kernel_variant(variant, _VARIANT_CHECK)


@pytest.mark.parametrize("kind", ["lstm", "lstm_peephole", "gru", "gru_reset_before"])
@pytest.mark.parametrize("L,bidirectional", [(1, False), (2, True)])
def test_served_onnx_model_matches_onnx_runtime(kind, L, bidirectional):
    """A model read by convert.from_onnx is served with .inference() (the README's way):
    its answers are ONNX Runtime's on the same model (to float32 rounding) and the read
    layer's forward bit for bit."""
    import onnxruntime as ort

    import blockrnn.onnx as bo
    from blockrnn import convert
    T_, B, I_, H_ = 6, 4, 5, 19
    D = 2 if bidirectional else 1
    if kind.startswith("lstm"):
        source = blockrnn.LSTM(I_, H_, L, bidirectional=bidirectional,
                               use_peephole=kind == "lstm_peephole", seed=L)
    else:
        source = blockrnn.GRU(I_, H_, L, bidirectional=bidirectional,
                              reset_after=kind == "gru", seed=L)
    model = bo.export(source, sequence_lens=True, initial_state=True)
    served = convert.from_onnx(model).inference()
    rng = np.random.default_rng(16)
    x = rng.uniform(-1, 1, (T_, B, I_)).astype(np.float32)
    lengths = np.array([6, 2, 3, 1], np.int32)   # no 0: ONNX Runtime's final state is then 0
    parts = [rng.uniform(-1, 1, (L * D, B, H_)).astype(np.float32)
             for _ in range(2 if kind.startswith("lstm") else 1)]
    state = tuple(parts) if kind.startswith("lstm") else parts[0]
    y, final = served(x, state, lengths)
    feed = {"X": x, "sequence_lens": lengths, **dict(zip(("initial_h", "initial_c"), parts))}
    out = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, feed)
    got = [y, *_states(final)]
    want = [out[0].transpose(0, 2, 1, 3).reshape(T_, B, D * H_), *out[1:]]
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5 * float(np.abs(w).max()))
    y_fwd, final_fwd, _ = convert.from_onnx(model).forward(x, state, lengths)
    _equal(got, [y_fwd, *_states(final_fwd)])


@pytest.mark.parametrize("threads", [1, 2])
def test_hoisted_input_projection_keeps_the_bits(threads):
    """The float32 training forwards compute x[:L] @ W_x of all steps before their
    time loop, in blocks of rows of x; the inference forward from 12 rows on computes
    x[t] @ W_x inside each step. At I > 256 (each element one sum over k, not blocks
    of 256), over several blocks of rows, with H not a multiple of 16 and lengths:
    the same bits."""
    T_, B, I_, H_ = 20, 13, 300, 120
    rng = np.random.default_rng(21)
    x = _rand(rng, (T_, B, I_))
    lens = rng.integers(0, T_ + 1, B)
    lens[0] = T_
    with threadpool_limits(threads, user_api="openmp"):
        for layer in (blockrnn.LSTM(I_, H_, seed=2), blockrnn.GRU(I_, H_, seed=2),
                      blockrnn.GRU(I_, H_, seed=2, reset_after=False)):
            for lengths in (None, lens):
                y, s, _ = layer.forward(x, sequence_length=lengths)
                y2, s2 = layer.inference()(x, sequence_length=lengths)
                _equal((y2, *_states(s2)), (y, *_states(s)))


def test_the_shedding_barrier_sheds_only_for_another_caller_or_a_shared_cpu():
    """brnn_barrier_wait_shed: with nobody else in the budget a 2-thread region keeps
    both threads (each answers 0, 2 still held) unless they ran on one CPU; when another
    caller is granted its own thread beyond a budget of 2, both threads answer 1 and the
    region has given its second thread back by the time they leave the barrier; on a
    larger budget the same caller over-commits nothing. Linux places the worker on the
    caller's CPU now and then, and a busy process can hold a worker's core for over
    1 ms (a stall either way): samples are drawn until three had no stall."""
    for cores, other, kept in ((2, False, True), (2, True, False), (3, True, True)):
        smooth = 0
        for _ in range(200):
            answers, left, stalled = _kernels.shed_barrier_answers(cores, other)
            if kept and not stalled:
                assert (answers, left) == ((0, 0), 2)
            else:
                assert (answers, left) == ((1, 1), 1)
            smooth += not stalled
            if smooth >= 3:
                break
        assert smooth >= 3
    assert _kernels.thread_budget_in_use() == 0


def test_a_patient_barrier_rides_out_a_stall_but_not_another_caller():
    """brnn_barrier_wait_shed(patient), a call of long steps: one barrier with its two
    threads on one CPU (a stall) does not shed; another caller beyond the budget sheds
    at once."""
    for other in (False, True):
        for _ in range(50):
            answers, left, stalled = _kernels.shed_barrier_answers(2, other, patient=True)
            assert (answers, left) == (((1, 1), 1) if other else ((0, 0), 2)), stalled


def test_a_patient_call_sheds_once_its_waits_are_a_third_of_its_time():
    """brnn_patient_sheds: a call of long steps sheds for its partners once their waits
    at its barriers add up to a third of the time since its first barrier, judged from
    20 ms on: a partner time-sliced with a busy process (waits of about half the time)
    sheds; a VM's moments (a few ms in a call) do not; a lone long wait in the first
    20 ms does not decide alone."""
    ms = 1_000_000
    sheds = _kernels.patient_sheds_for
    assert sheds(10 * ms, 20 * ms)          # half the time, at 20 ms
    assert sheds(10 * ms, 30 * ms)          # exactly a third
    assert not sheds(10 * ms - 1, 30 * ms)
    assert not sheds(6 * ms, 20 * ms)       # three 2 ms moments within the first 20 ms
    assert not sheds(6 * ms, 130 * ms)
    assert not sheds(19 * ms, 19 * ms)      # before 20 ms: never
    assert not sheds(0, 10**12)
    assert _kernels.thread_budget_in_use() == 0


def test_the_probe_is_rarer_while_one_thread_measured_over_twice_as_slow():
    """brnn_pace_plan: while several threads are not slower, every 64th call probes one
    thread; every 256th while one thread's mean is over twice several threads' (a
    probe then costs more than a whole call). Several threads slower by more than an
    eighth: one thread (no try due)."""
    plans = _kernels.pace_plans_for
    assert plans(3, 2, 128) == ([2] * 63 + [1]) * 2
    assert plans(0, 0, 64) == [2] * 63 + [1]                 # nothing measured yet
    assert plans(10**6, 10**6 // 2 - 1, 512) == ([2] * 255 + [1]) * 2
    assert plans(2 * 10**6, 10**6, 64) == [2] * 63 + [1]     # exactly twice: not over
    assert plans(100, 112, 64) == [2] * 63 + [1]             # within an eighth
    assert plans(100, 113, 8) == [1] * 8


def test_solo_spells_double_while_stalls_recur_and_start_short_again():
    """brnn_solo_start: a shed for a stalled partner runs its object's calls on one
    thread for 4 ms; a shed again within 20 ms of a spell's end (a busy process on the
    partner's core stalls it again at the next try) doubles the spell, up to 50 ms; a
    shed later than that (an isolated stall: the VM held a CPU) starts at 4 ms again."""
    ms = 1_000_000
    t, times = 10**12, []
    for spell in (4, 8, 16, 32, 50, 50):       # each shed 1 ms after the last spell's end
        times.append(t)
        t += (spell + 1) * ms
    times.append(t + 20 * ms)                  # 21 ms after the end of the last spell
    times.append(times[-1] + 4 * ms + 19 * ms)  # 19 ms after: doubles again
    spells = _kernels.solo_spells_for(times)
    assert [v // ms for v in spells] == [4, 8, 16, 32, 50, 50, 4, 8]


def test_calls_of_long_steps_are_patient():
    """infer_patient: a call sheds at its partner's first stall while a step gives each
    thread at most 2^20 multiply-adds (batch 1 and the serving batches), else it is
    patient: an LSTM at 100,64,512,512 on 2 threads (2^25 a thread) rides out stalls.
    A step counts B x H x G once the input projection is hoisted (B < 12)."""
    patient = _kernels.inference_patient_for
    assert not patient(50, 1, 128, 128, 4 * 128, 2)
    assert not patient(64, 8, 256, 256, 4 * 256, 2)        # 8*256*1024 = 2 * 2^20
    assert patient(64, 8, 256, 256, 4 * 256, 1)
    assert patient(100, 64, 512, 512, 4 * 512, 2)
    assert patient(100, 32, 256, 256, 3 * 256, 2)
    assert not patient(100, 16, 32, 32, 3 * 32, 2)          # not hoisted: 16*(32+32)*96


@pytest.mark.parametrize("name,make", SHED_LAYERS)
def test_a_call_on_several_threads_writes_y_from_a_cache_line(name, make):
    """The threads of a call write neighbouring 16-cell panels of every row of y: y
    starts on a 64-byte boundary so that no cache line holds both threads' cells (a
    cell count that is a multiple of 16); the answer is the one-thread answer."""
    layer = make()
    infer = type(layer.inference())(layer, idle_ns=0)
    run = infer._runs[0]
    x = np.random.default_rng(5).standard_normal((9, 1, 64)).astype(np.float32)
    ys = []
    for _ in range(8):        # 8 live arrays: not one address by chance
        # No solo spell: a call that shed (its partner thread stalled: a busy host)
        # runs the next ones on one thread, whose y need not start on a cache line.
        run._set_pace(0, 0)
        ys.append(infer(x)[0])
        assert run.last_threads == 2
    for y in ys:
        assert y.ctypes.data % 64 == 0 and y.flags.c_contiguous and y.shape == (9, 1, 256)
    np.testing.assert_array_equal(ys[0], run.forward(x, max_threads=1)[0])


@pytest.mark.parametrize("value,exc,match", [
    (0, ValueError, "got 0"), (-2, ValueError, "got -2"), (True, TypeError, "got bool"),
    (np.bool_(True), TypeError, "got bool"), (2.0, TypeError, "got float"),
    ("2", TypeError, "got str")])
def test_max_threads_must_be_a_positive_int(value, exc, match):
    layer = blockrnn.GRU(I, H, seed=3)
    x = np.ones((T, 2, I), np.float32)
    with pytest.raises(exc, match=f"^GRUInference: max_threads must be None or a positive "
                                  f"int, {match}"):
        layer.inference(max_threads=value)
    with pytest.raises(exc, match=f"^PackedGRUResetAfterWeights.forward: max_threads must be "
                                  f"None or a positive int, {match}"):
        layer.inference()._runs[0].forward(x, max_threads=value)


def test_max_threads_takes_numpy_integers_and_any_size():
    """A NumPy integer is an int (it used to be refused); more threads than OpenMP has
    are capped, even past a C int (the cast used to raise OverflowError)."""
    layer = blockrnn.LSTM(I, H, seed=3)
    x = np.ones((T, 2, I), np.float32)
    want = layer.forward(x)[0]
    for value in (np.int64(1), np.uint8(2), 2**40):
        infer = layer.inference(max_threads=value)
        assert type(infer.max_threads) is int
        assert_array_equal(infer(x)[0], want)
        assert_array_equal(infer._runs[0].forward(x, max_threads=value)[0], want)

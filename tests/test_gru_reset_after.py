"""The reset-after GRU ops (block_gru_reset_after, its gradient, the cell):
nn.GRU as the oracle (float64 1e-10, float32 1e-5) for outputs, final state
and every gradient, with per-row sequence lengths; float64 finite
differences without torch; the float64 reference; bits independent of the
thread count; every packed-kernel variant (BLOCKRNN_KERNEL, in a subprocess)
against float64; float16; array variants; bad input.

PyTorch is required (the test extras install it): a missing torch FAILS these tests.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

try:
    import torch
    from torch import nn
except ImportError as exc:  # pragma: no cover - depends on the environment
    pytest.fail(f"PyTorch is required for the reset-after GRU tests ({exc!r}); install the "
                f"test extras with `pip install -e .[test]`", pytrace=False)

import blockrnn
from blockrnn import _kernels
from blockrnn import _reference as ref

INPUTS = ("x", "h_prev", "w_ih", "w_hh", "b_ih", "b_hh")
GRADS = ("x_grad", "h_prev_grad", "w_ih_grad", "w_hh_grad", "b_ih_grad", "b_hh_grad")


def problem(T, B, I, H, seed=0, dtype=np.float64):
    """x, h_prev, w_ih, w_hh, b_ih, b_hh and an upstream gradient h_grad."""
    rng = np.random.default_rng(seed)
    r = lambda *s: rng.uniform(-1, 1, s)  # noqa: E731
    scale = 1 / np.sqrt(max(H, 1))
    args = (r(T, B, I), r(B, H), r(3 * H, I) * scale, r(3 * H, H) * scale, r(3 * H),
            r(3 * H))
    return tuple(a.astype(dtype) for a in args), r(T, B, H).astype(dtype)


def relerr(a, b):
    """max |a - b| / max(1, max |b|)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b), initial=0) / max(1.0, np.max(np.abs(b), initial=0)))


def torch_gru(args, h_grad, lengths=None, dtype=torch.float64):
    """nn.GRU (one layer) on x, h_prev with the given weights, row by row when
    `lengths` is given (a row of length m runs its first m steps alone; its
    outputs after them are zero and its gradients come from those steps).
    Returns (out (T, B, H), final (B, H), grads in GRADS order)."""
    x, h0, w_ih, w_hh, b_ih, b_hh = args
    T, B, I = x.shape
    H = h0.shape[1]
    gru = nn.GRU(max(I, 1), H).to(dtype)   # nn.GRU refuses input_size 0: build it with 1,
    with torch.no_grad():                  # then give it the (3H, I) weight (I = 0 runs)
        gru.weight_ih_l0 = nn.Parameter(torch.tensor(w_ih, dtype=dtype))
        gru.weight_hh_l0.copy_(torch.tensor(w_hh))
        gru.bias_ih_l0.copy_(torch.tensor(b_ih))
        gru.bias_hh_l0.copy_(torch.tensor(b_hh))
    gru.input_size = I
    tx = torch.tensor(x, dtype=dtype, requires_grad=True)
    th = torch.tensor(h0, dtype=dtype, requires_grad=True)
    lengths = np.full(B, T) if lengths is None else np.asarray(lengths)
    out = torch.zeros(T, B, H, dtype=dtype)
    final = th.detach().clone()
    loss = 0
    for b in range(B):
        m = int(lengths[b])
        if m == 0:
            continue
        o, hT = gru(tx[:m, b:b + 1], th[None, b:b + 1])
        loss = loss + (o * torch.tensor(h_grad[:m, b:b + 1], dtype=dtype)).sum()
        out[:m, b] = o[:, 0].detach()
        final[b] = hT[0, 0].detach()
    params = [gru.weight_ih_l0, gru.weight_hh_l0, gru.bias_ih_l0, gru.bias_hh_l0]
    if torch.is_tensor(loss):
        grads = torch.autograd.grad(loss, [tx, th] + params, allow_unused=True)
    else:
        grads = [None] * 6
    ref_shapes = [a.shape for a in args]
    grads = [np.zeros(s) if g is None else g.numpy() for g, s in zip(grads, ref_shapes)]
    return out.numpy(), final.numpy(), grads


def final_state(h, h0, lengths):
    """Each row's state after its last step (h0 for a row of length 0)."""
    T = h.shape[0]
    lengths = np.full(h.shape[1], T) if lengths is None else np.asarray(lengths)
    return np.stack([h[m - 1, b] if m else h0[b] for b, m in enumerate(lengths)])


# (4, 1, 8, 400): batch 1's backward on the packed loop (PACKED_ROW1_MIN_CELLS)
SHAPES = [(5, 3, 4, 7), (6, 1, 5, 20), (4, 8, 0, 33), (3, 5, 17, 40), (1, 2, 3, 16),
          (7, 4, 9, 1), (4, 1, 8, 400)]


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 1e-5)],
                         ids=["float64", "float32"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
def test_matches_nn_gru(shape, dtype, tol, with_lengths, parity_record):
    T, B, I, H = shape
    args, h_grad = problem(*shape, seed=sum(shape), dtype=dtype)
    lengths = None
    if with_lengths:   # rows of length 0, 1 and T, the rest random
        lengths = np.random.default_rng(B).integers(0, T + 1, B)
        lengths[: min(B, 3)] = [0, 1, T][: min(B, 3)]
    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    out, final, grads = torch_gru(args, h_grad, lengths, tdtype)
    fwd = blockrnn.block_gru_reset_after(T, *args, sequence_length=lengths)
    assert all(a.dtype == dtype and a.shape == (T, B, H) for a in fwd)
    label = f"nn.GRU {np.dtype(dtype).name}"
    for what, got, expected in [("h", fwd.h, out),
                                ("final", final_state(fwd.h, args[1], lengths), final)]:
        err = relerr(got, expected)
        parity_record(f"{label} {what}", err)
        assert err <= tol, (what, err)
    bwd = blockrnn.block_gru_reset_after_grad(T, *args, *fwd, h_grad, sequence_length=lengths)
    for name, got, expected, inp in zip(GRADS, bwd, grads, args):
        assert got.dtype == dtype and got.shape == inp.shape, name
        err = relerr(got, expected)
        parity_record(f"{label} {name}", err)
        assert err <= tol, (name, err)


def test_rows_past_their_length_are_zero_and_padding_is_not_read():
    args, h_grad = problem(6, 4, 3, 18, seed=3)
    lengths = np.array([0, 1, 6, 3])
    fwd = blockrnn.block_gru_reset_after(5, *args, sequence_length=lengths)
    steps = np.minimum(lengths, 5)
    for b, m in enumerate(steps):
        for a in fwd:
            assert np.all(a[m:, b] == 0)
            assert np.all(a[:m, b] != 0)
    # NaN wherever the backward must not read (the padding of every output
    # and of h_grad) changes no bit of any gradient.
    clean = blockrnn.block_gru_reset_after_grad(5, *args, *fwd, h_grad,
                                                sequence_length=lengths)
    dirty = [a.copy() for a in (*fwd, h_grad)]
    for a in dirty:
        for b, m in enumerate(steps):
            a[m:, b] = np.nan
    got = blockrnn.block_gru_reset_after_grad(5, *args, *dirty, sequence_length=lengths)
    for c, g in zip(clean, got):
        np.testing.assert_array_equal(g, c)
    assert np.all(clean.x_grad[:, 0] == 0) and np.all(clean.h_prev_grad[0] == 0)
    assert np.all(clean.x_grad[5:] == 0)


@pytest.mark.parametrize("L", [0, 2, 5])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
def test_matches_float64_reference(L, with_lengths):
    args, h_grad = problem(5, 3, 4, 6, seed=L)
    lengths = np.array([4, 0, 5]) if with_lengths else None
    fwd = blockrnn.block_gru_reset_after(L, *args, sequence_length=lengths)
    expected = ref.block_gru_reset_after(L, *args, sequence_length=lengths)
    for got, e in zip(fwd, expected):
        np.testing.assert_allclose(got, e, rtol=0, atol=1e-13)
    bwd = blockrnn.block_gru_reset_after_grad(L, *args, *fwd, h_grad, sequence_length=lengths)
    expected = ref.block_gru_reset_after_grad(L, *args, *fwd, h_grad,
                                              sequence_length=lengths)
    for got, e in zip(bwd, expected):
        np.testing.assert_allclose(got, e, rtol=0, atol=1e-12)


def fd_grad(loss, arrays, name, eps=1e-6):
    """Central finite differences of loss() w.r.t. arrays[name]."""
    a = arrays[name]
    g = np.zeros_like(a)
    for idx in np.ndindex(a.shape):
        orig = a[idx]
        a[idx] = orig + eps
        lp = loss()
        a[idx] = orig - eps
        lm = loss()
        a[idx] = orig
        g[idx] = (lp - lm) / (2 * eps)
    return g


@pytest.mark.parametrize("lengths", [None, [3, 0, 1]], ids=["full", "lengths"])
@pytest.mark.parametrize("B", [1, 3])
def test_finite_differences(B, lengths):
    """float64, no torch: loss = sum(h * G); the batch-1 and batch-3 routes."""
    T, I, H = 3, 3, 4
    args, G = problem(T, B, I, H, seed=B)
    lengths = None if lengths is None else np.array(lengths[:B])
    arrays = dict(zip(INPUTS, (a.copy() for a in args)))

    def loss():
        out = blockrnn.block_gru_reset_after(T, *arrays.values(), sequence_length=lengths)
        return float(np.sum(out.h * G))

    fwd = blockrnn.block_gru_reset_after(T, *arrays.values(), sequence_length=lengths)
    bwd = blockrnn.block_gru_reset_after_grad(T, *arrays.values(), *fwd, G,
                                              sequence_length=lengths)
    for name, got in zip(INPUTS, bwd):
        np.testing.assert_allclose(got, fd_grad(loss, arrays, name), rtol=1e-6, atol=1e-8,
                                   err_msg=name)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_cell_matches_nn_gru_cell(dtype, tol):
    B, I, H = 4, 5, 6
    (x, h0, w_ih, w_hh, b_ih, b_hh), hg = problem(1, B, I, H, seed=9, dtype=dtype)
    x, hg = x[0], hg[0]
    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    cell = nn.GRUCell(I, H).to(tdtype)
    with torch.no_grad():
        for p, v in zip(cell.parameters(), (w_ih, w_hh, b_ih, b_hh)):
            p.copy_(torch.tensor(v))
    tx, th = (torch.tensor(a, requires_grad=True) for a in (x, h0))
    h = cell(tx, th)
    grads = torch.autograd.grad((h * torch.tensor(hg)).sum(), [tx, th, *cell.parameters()])
    out = blockrnn.gru_cell_reset_after(x, h0, w_ih, w_hh, b_ih, b_hh)
    assert out._fields == ("r", "z", "n", "hn", "h")
    assert all(a.shape == (B, H) and a.dtype == dtype for a in out)
    assert relerr(out.h, h.detach().numpy()) <= tol
    bwd = blockrnn.gru_cell_reset_after_grad(x, h0, w_ih, w_hh, b_ih, b_hh, *out[:4], hg)
    assert bwd._fields == GRADS
    for name, got, e in zip(GRADS, bwd, grads):
        assert got.shape == e.shape, name
        assert relerr(got, e.numpy()) <= tol, name


# T, B, I, H: several threads forward (B*(I+H)*3H >= 2^21) and backward, H not
# a multiple of 16, B = 1 (one-row route, packed input projection; its steps on
# several threads at H = 848), I = 0, T = 1.
THREAD_SHAPES = [(5, 3, 4, 37), (7, 9, 0, 1), (6, 1, 8, 64), (1, 2, 3, 16),
                 (3, 13, 20, 200), (2, 2, 64, 600), (2, 24, 60, 200), (64, 1, 320, 160),
                 (3, 1, 8, 848)]


def _run32(shape, seed, lengths):
    args, hg = problem(*shape, seed=seed, dtype=np.float32)
    fwd = blockrnn.block_gru_reset_after(shape[0], *args, sequence_length=lengths)
    return [*fwd, *blockrnn.block_gru_reset_after_grad(shape[0], *args, *fwd, hg,
                                                       sequence_length=lengths)]


def test_the_shapes_below_do_run_on_several_threads():
    """The training loops' rules on a step's recurrent product: the forward's
    (sequence_threads, the LSTM's: at batch 1 the inference forward's) and the
    backward's (gru_sequence_threads; batch 1's backward steps run on the caller)."""
    assert _kernels.gru_sequence_threads_for(24, 200, 4) == 4      # backward
    assert _kernels.sequence_threads_for(24, 200, 600, 200, 4) == 4   # forward
    assert _kernels.gru_sequence_threads_for(2, 600, 4) == 4
    assert _kernels.sequence_threads_for(2, 600, 1800, 600, 4) == 4
    assert _kernels.gru_sequence_threads_for(3, 37, 4) == 1
    assert _kernels.sequence_threads_for(3, 37, 111, 37, 4) == 1
    assert _kernels.sequence_threads_for(1, 160, 480, 160, 4) == 4   # batch 1's forward
    assert _kernels.sequence_threads_for(1, 848, 2544, 848, 4) == 4
    # the GRUs' backward rule at batch 1, and the TF GRU's batch-1 forward (unchanged)
    assert _kernels.packed_input_threads_for(64, 320, 3 * 160, 160, 4) == 2
    assert _kernels.gru_sequence_threads_for(1, 160, 4) == 2
    assert _kernels.gru_sequence_threads_for(1, 848, 4) == 4
    assert _kernels.loop_threads_for(4, 64 * 1 * (320 + 160) * 480, "forward") == 4


@pytest.mark.parametrize("shape", THREAD_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
def test_bits_do_not_depend_on_the_thread_count(shape, with_lengths):
    lengths = None
    if with_lengths:
        lengths = np.random.default_rng(1).integers(0, shape[0] + 1, shape[1])
        lengths[0] = 0
    with threadpool_limits(1, user_api="openmp"):
        serial = _run32(shape, sum(shape), lengths)
    for n in (2, 3, 4):
        with threadpool_limits(n, user_api="openmp"):
            got = _run32(shape, sum(shape), lengths)
        for e, g in zip(serial, got):
            np.testing.assert_array_equal(g, e)
    assert _kernels.thread_budget_in_use() == 0


def test_concurrent_callers_give_the_serial_bits():
    from concurrent.futures import ThreadPoolExecutor
    jobs = [(shape, k, None if k % 2 else np.arange(shape[1]) % (shape[0] + 1))
            for k, shape in enumerate(THREAD_SHAPES * 2)]
    serial = [_run32(*job) for job in jobs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        threaded = list(pool.map(lambda job: _run32(*job), jobs))
    for expected, got in zip(serial, threaded):
        for e, g in zip(expected, got):
            np.testing.assert_array_equal(g, e)
    assert _kernels.thread_budget_in_use() == 0


VARIANT_CHECK = textwrap.dedent("""
    import sys
    import numpy as np, blockrnn
    from threadpoolctl import threadpool_limits
    from blockrnn import _kernels
    sys.path.insert(0, {tests!r})
    from test_gru_reset_after import problem
    assert _kernels.packed_kernel_name() == {path!r}, _kernels.packed_kernel_name()
    worst = 0.0
    for T, B, I, H in {shapes!r}:
        args, hg = problem(T, B, I, H, seed=T + B)
        lengths = np.random.default_rng(B).integers(0, T + 1, B)
        def run(a, g):
            fwd = blockrnn.block_gru_reset_after(T, *a, sequence_length=lengths)
            return [*fwd, *blockrnn.block_gru_reset_after_grad(T, *a, *fwd, g,
                                                               sequence_length=lengths)]
        expected = run(args, hg)
        runs = []
        for n in (1, 3):
            with threadpool_limits(n, user_api="openmp"):
                runs.append(run([a.astype(np.float32) for a in args], hg.astype(np.float32)))
        for a, b in zip(*runs):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(runs[0], expected):
            worst = max(worst, float(np.max(np.abs(a - b) / (1 + np.abs(b)), initial=0)))
    assert worst < 2e-5, worst
    print("ok", worst)
""")


@pytest.mark.parametrize("path", _kernels.packed_paths_supported())
def test_every_kernel_variant_agrees_with_float64(path):
    shapes = [(5, 3, 4, 37), (6, 1, 8, 64), (3, 13, 20, 200), (2, 24, 60, 200),
              (4, 1, 8, 400)]
    code = VARIANT_CHECK.format(path=path, shapes=shapes,
                                tests=os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, env=dict(os.environ, BLOCKRNN_KERNEL=path))
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-3000:]


def test_float16_is_stored_float16_and_close_to_float64():
    args, hg = problem(4, 3, 5, 8, seed=2)
    half = [a.astype(np.float16) for a in args]
    fwd = blockrnn.block_gru_reset_after(4, *half)
    bwd = blockrnn.block_gru_reset_after_grad(4, *half, *fwd, hg.astype(np.float16))
    e_fwd = ref.block_gru_reset_after(4, *half)
    e_bwd = ref.block_gru_reset_after_grad(4, *half, *e_fwd, hg.astype(np.float16))
    for got, e in zip([*fwd, *bwd], [*e_fwd, *e_bwd]):
        assert got.dtype == np.float16
        assert relerr(got, e) < 1e-2


def _variants(a, tmp_path, k):
    """The same values as: big-endian, non-contiguous, a memmap."""
    swapped = a.astype(a.dtype.newbyteorder("S"))
    strided = np.repeat(a, 2, axis=-1)[..., ::2]
    path = tmp_path / f"a{k}.bin"
    m = np.memmap(path, dtype=a.dtype, mode="w+", shape=a.shape)
    m[...] = a
    m.flush()
    return [swapped, strided, np.memmap(path, dtype=a.dtype, mode="r", shape=a.shape)]


def test_any_numpy_array_computes_as_its_native_contiguous_copy(tmp_path):
    args, hg = problem(3, 2, 4, 5, seed=4, dtype=np.float32)
    fwd = blockrnn.block_gru_reset_after(3, *args)
    bwd = blockrnn.block_gru_reset_after_grad(3, *args, *fwd, hg)
    variants = [_variants(a, tmp_path, k) for k, a in enumerate([*args, hg])]
    for v in range(3):
        got_args = [vs[v] for vs in variants]
        got = blockrnn.block_gru_reset_after(3, *got_args[:6])
        for g, e in zip(got, fwd):
            assert g.dtype == np.float32
            np.testing.assert_array_equal(g, e)
        got = blockrnn.block_gru_reset_after_grad(3, *got_args[:6], *fwd, got_args[6])
        for g, e in zip(got, bwd):
            np.testing.assert_array_equal(g, e)


def test_empty_batch_and_cells():
    for B, H in [(0, 4), (3, 0)]:
        args, hg = problem(3, B, 2, H)
        fwd = blockrnn.block_gru_reset_after(3, *args)
        assert all(a.shape == (3, B, H) for a in fwd)
        bwd = blockrnn.block_gru_reset_after_grad(3, *args, *fwd, hg)
        for g, a in zip(bwd, args):
            assert g.shape == a.shape and not g.any()


def _bad(**change):
    args, hg = problem(3, 2, 4, 5)
    values = dict(zip(INPUTS, args))
    values.update(change)
    return values


@pytest.mark.parametrize("change,error,match", [
    (dict(w_ih=np.zeros((15, 3))), ValueError, r"w_ih must have shape \[3H, I\] = \(15, 4\), got \(15, 3\)"),
    (dict(w_ih=np.zeros((4, 15))), ValueError, r"w_ih must have shape \[3H, I\] = \(15, 4\), got \(4, 15\)"),
    (dict(w_hh=np.zeros((5, 15))), ValueError, r"w_hh must have shape \[3H, H\] = \(15, 5\), got \(5, 15\)"),
    (dict(b_hh=np.zeros(10)), ValueError, r"b_hh must have shape \[3H\] = \(15,\), got \(10,\)"),
    (dict(b_ih=np.zeros((2, 15))), ValueError, r"b_ih must have shape \[3H\] = \(15,\), got \(2, 15\)"),
    (dict(x=np.zeros((2, 4))), ValueError, r"x must have rank 3 \(shape \[T, B, I\]\), got rank 2"),
    (dict(h_prev=np.zeros((3, 5))), ValueError, r"h_prev must have shape \[B, H\] = \(2, 5\), got \(3, 5\)"),
    (dict(w_hh=np.zeros((15, 5), np.float32)), TypeError, "w_hh has dtype float32 but x has dtype float64"),
    (dict(x=np.zeros((3, 2, 4), np.int64)), TypeError, "x must have dtype float16, float32 or float64, got int64"),
])
def test_bad_input_is_a_clear_error(change, error, match):
    with pytest.raises(error, match="block_gru_reset_after: " + match):
        blockrnn.block_gru_reset_after(3, **_bad(**change))


def test_bad_lengths_and_gradient_shapes():
    values = _bad()
    with pytest.raises(ValueError, match=r"seq_len_max must be in \[0, T\] = \[0, 3\]"):
        blockrnn.block_gru_reset_after(4, **values)
    with pytest.raises(ValueError, match=r"sequence_length must have shape \(B,\) = \(2,\)"):
        blockrnn.block_gru_reset_after(3, **values, sequence_length=[1, 2, 3])
    with pytest.raises(ValueError, match=r"sequence_length entries must be in \[0, T\]"):
        blockrnn.block_gru_reset_after(3, **values, sequence_length=[1, 4])
    fwd = blockrnn.block_gru_reset_after(3, **values)
    with pytest.raises(ValueError, match=r"block_gru_reset_after_grad: h_grad must have "
                                         r"shape \[T, B, H\] = \(3, 2, 5\), got \(3, 2, 4\)"):
        blockrnn.block_gru_reset_after_grad(3, *values.values(), *fwd, np.zeros((3, 2, 4)))
    with pytest.raises(ValueError, match=r"gru_cell_reset_after: w_ih must have shape "
                                         r"\[3H, I\] = \(15, 4\), got \(15, 5\)"):
        blockrnn.gru_cell_reset_after(np.zeros((2, 4)), np.zeros((2, 5)), np.zeros((15, 5)),
                                      np.zeros((15, 5)), np.zeros(15), np.zeros(15))
    with pytest.raises(ValueError, match=r"gru_cell_reset_after_grad: h_grad must have "
                                         r"shape \[B, H\] = \(2, 5\), got \(2, 4\)"):
        blockrnn.gru_cell_reset_after_grad(
            np.zeros((2, 4)), np.zeros((2, 5)), np.zeros((15, 4)), np.zeros((15, 5)),
            np.zeros(15), np.zeros(15), *[np.zeros((2, 5))] * 4, np.zeros((2, 4)))


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 1e-5)],
                         ids=["float64", "float32"])
@pytest.mark.parametrize("lengths", [None, [5, 0, 1, 3]], ids=["full", "lengths"])
def test_stacked_bidirectional_layer_matches_nn_gru(dtype, tol, lengths, parity_record):
    """blockrnn.GRU (reset_after=True, 2 layers, bidirectional) with nn.GRU's
    parameters (the same names) gives nn.GRU's output, final state and
    gradients (x, h0, every parameter); rows by themselves when lengths are
    given (nn.GRU has no length-0 rows: such a row's output is zero, its final
    state h0)."""
    T, B, I, H, NL = 5, 4, 3, 6, 2
    layer = blockrnn.GRU(I, H, NL, bidirectional=True, dtype=dtype, seed=0)
    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    gru = nn.GRU(I, H, NL, bidirectional=True).to(tdtype)
    with torch.no_grad():
        for name, p in gru.named_parameters():
            p.copy_(torch.tensor(layer.params[name]))
    assert sorted(layer.params) == sorted(n for n, _ in gru.named_parameters())
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (T, B, I)).astype(dtype)
    h0 = rng.uniform(-1, 1, (2 * NL, B, H)).astype(dtype)
    wy = rng.uniform(-1, 1, (T, B, 2 * H)).astype(dtype)
    wh = rng.uniform(-1, 1, (2 * NL, B, H)).astype(dtype)
    lens = None if lengths is None else np.array(lengths)
    y, h_n, ctx = layer.forward(x, h0, sequence_length=lens)
    dx, dh0 = layer.backward(ctx, wy, wh)

    tx = torch.tensor(x, requires_grad=True)
    th = torch.tensor(h0, requires_grad=True)
    ty, th_n = torch.zeros(T, B, 2 * H, dtype=tdtype), th.detach().clone()
    loss = 0
    for b in range(B):
        m = T if lens is None else int(lens[b])
        if m == 0:
            loss = loss + (th[:, b] * torch.tensor(wh[:, b])).sum()   # h_n = h0
            continue
        o, hb = gru(tx[:m, b:b + 1], th[:, b:b + 1])
        loss = (loss + (o * torch.tensor(wy[:m, b:b + 1])).sum()
                + (hb * torch.tensor(wh[:, b:b + 1])).sum())
        ty[:m, b] = o[:, 0].detach()
        th_n[:, b] = hb[:, 0].detach()
    names = [n for n, _ in gru.named_parameters()]
    grads = torch.autograd.grad(loss, [tx, th] + list(gru.parameters()))
    checks = [("y", y, ty), ("h_n", h_n, th_n), ("x_grad", dx, grads[0]),
              ("h0_grad", dh0, grads[1])]
    checks += [(n, layer.grads[n], g) for n, g in zip(names, grads[2:])]
    for what, got, expected in checks:
        assert got.dtype == dtype, what
        err = relerr(got, expected.numpy())
        parity_record(f"nn.GRU stacked bidirectional {np.dtype(dtype).name} {what}", err)
        assert err <= tol, (what, err)

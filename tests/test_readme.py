"""The README's Python examples run as printed and give what their comments say.

Each ```python block of README.md is executed verbatim. Blocks that continue an earlier
one (they use its variables) run in that block's namespace; the variables a block only
assumes (``dy``, ``keras_lstm``, ...) are defined here, in the setup of its test. One
block is not run here: the ``torchrun`` one needs two processes (tests/test_ddp.py trains
that way).
"""
import os
import re

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "README.md")


def python_blocks():
    """The README's ```python blocks, dedented, in order."""
    with open(README, encoding="utf-8") as fh:
        text = fh.read()
    blocks = []
    for m in re.finditer(r"^( *)```python\n(.*?)^\1```", text, re.S | re.M):
        indent = len(m.group(1))
        blocks.append("".join(line[indent:] for line in m.group(2).splitlines(True)))
    return blocks


def block(first_line):
    """The one block whose first line starts with `first_line` (the test fails, rather
    than passing vacuously, if the README no longer has it)."""
    found = [b for b in python_blocks() if b.startswith(first_line)]
    assert len(found) == 1, f"README: {len(found)} python blocks start with {first_line!r}"
    return found[0]


def run(code, namespace):
    exec(compile(code, README, "exec"), namespace)
    return namespace


def test_every_block_is_run_or_named_as_not_run():
    firsts = [b.splitlines()[0] for b in python_blocks()]
    tested = ("import numpy as np", "lengths = ", "lstm = blockrnn.LSTM",
              "import blockrnn.torch", "import jax", "from blockrnn import convert",
              "import onnxruntime", "x_rev = ", "from threadpoolctl import threadpool_limits")
    not_run = ("# torchrun",)
    unknown = [f for f in firsts if not f.startswith(tested + not_run)]
    assert not unknown, f"README python blocks this test does not know: {unknown}"
    assert len(firsts) == len(tested) + len(not_run)


@pytest.fixture
def example():
    """The namespace after the README's first example (## Example)."""
    return run(block("import numpy as np\nimport blockrnn\n"), {})


def test_example(example):
    import blockrnn
    ns = example
    T, B, H = ns["T"], ns["B"], ns["H"]
    assert ns["grads"].w_grad.shape == (48, 128)                 # its comment
    assert all(a.shape == (T, B, H) for a in ns["fwd"])
    # The raw_ops spelling is the same op.
    for a, b in zip(ns["out"], ns["fwd"]):
        np.testing.assert_array_equal(a, b)
    # The gradient is that of sum(h): compare one weight with a float64 difference.
    x, cs0, h0, w = (np.asarray(ns[k], np.float64) for k in ("x", "cs0", "h0", "w"))
    rest = [np.asarray(ns[k], np.float64) for k in ("wci", "wcf", "wco", "b")]
    eps = 1e-6
    w_plus, w_minus = w.copy(), w.copy()
    w_plus[3, 5] += eps
    w_minus[3, 5] -= eps
    h_sum = [blockrnn.block_lstm_v2(T, x, cs0, h0, ww, *rest).h.sum()
             for ww in (w_plus, w_minus)]
    np.testing.assert_allclose(ns["grads"].w_grad[3, 5], (h_sum[0] - h_sum[1]) / (2 * eps),
                               rtol=1e-3, atol=1e-4)


def test_sequence_length(example):
    ns = run(block("lengths = "), example)
    lengths, fwd, B = ns["lengths"], ns["fwd"], ns["B"]
    assert 0 in lengths
    for row in range(B):
        last = fwd.h[lengths[row] - 1, row] if lengths[row] else ns["h0"][row]
        np.testing.assert_array_equal(ns["h_final"][row], last)
        assert not fwd.h[lengths[row]:, row].any()      # zero after each row's length


def test_training_in_numpy(example):
    ns = run(block("lengths = "), example)
    T, B = ns["T"], ns["B"]
    ns["dy"] = np.ones((T, B, 32), np.float32)
    ns["dh"] = np.ones((1, B, 32), np.float32)
    run("import blockrnn\n" + block("lstm = blockrnn.LSTM"), ns)
    assert ns["y"].shape == (T, B, 32) and ns["dx"].shape == ns["x"].shape
    # The loop applied the gradients: the parameters are no longer the seed's.
    import blockrnn
    fresh = blockrnn.LSTM(16, 32, seed=0)
    assert set(fresh.params) == set(ns["lstm"].params)
    for name, p in ns["lstm"].params.items():
        np.testing.assert_allclose(p, fresh.params[name] - 0.1 * ns["lstm"].grads[name],
                                   rtol=1e-6, atol=1e-7)


def test_torch():
    import torch
    B, T = 4, 6
    g = torch.Generator().manual_seed(0)
    ns = {"x": torch.randn(B, T, 16, generator=g),
          "h0": torch.zeros(4, B, 32), "c0": torch.zeros(4, B, 32),
          "x_time_major": torch.randn(T, B, 16, generator=g),
          "nn_lstm": torch.nn.LSTM(16, 32, 2, bidirectional=True)}
    run(block("import blockrnn.torch"), ns)
    assert ns["y"].shape == (T, B, 32) and ns["h_n"].shape == (2, B, 32)   # the GRU's
    # The LSTM ran before y, h_n were rebound by the GRU; check its layout of states.
    lstm = ns["lstm"].eval()
    y, (h_n, c_n) = lstm(ns["x"], (ns["h0"], ns["c0"]))
    assert y.shape == (B, T, 64) and h_n.shape == c_n.shape == (4, B, 32)
    torch.testing.assert_close(y[:, -1, :32], h_n[2])    # layer 1 forward: after step T-1
    torch.testing.assert_close(y[:, 0, 32:], h_n[3])     # layer 1 reverse: after step 0
    want, _ = ns["nn_lstm"](ns["x_time_major"])
    torch.testing.assert_close(ns["converted"](ns["x_time_major"])[0], want)


def test_weight_import():
    import keras
    import torch
    T, B = 5, 3
    keras_lstm = keras.layers.LSTM(32)
    keras_lstm.build((None, T, 16))
    ns = {"keras_lstm": keras_lstm,
          "torch_nn_lstm": torch.nn.LSTM(16, 32, num_layers=2, bidirectional=True),
          "x_time_major": np.random.default_rng(0).standard_normal((T, B, 16), np.float32)}
    run(block("from blockrnn import convert"), ns)
    y, (h, c) = ns["y"], ns["state"]
    want, (h_t, c_t) = ns["torch_nn_lstm"](torch.from_numpy(ns["x_time_major"]))
    assert y.shape == (T, B, 64) and h.shape == c.shape == (4, B, 32)
    for got, ref in ((y, want), (h, h_t), (c, c_t)):
        np.testing.assert_allclose(got, ref.detach().numpy(), rtol=1e-5, atol=1e-5)


def test_jax(example):
    import blockrnn
    ns = run(block("import jax\n"), example)
    layer, x = ns["layer"], ns["x"]
    grads = ns["grads"]
    assert set(grads) == set(layer.params) == {"w_l0", "b_l0"}
    # The gradient of mean(y ** 2), from the NumPy layer's backward.
    y, _, ctx = layer.forward(x)
    layer.backward(ctx, 2 * y / y.size)
    for name, g in layer.grads.items():
        np.testing.assert_allclose(np.asarray(grads[name]), g, rtol=1e-5,
                                   atol=1e-6 * float(np.abs(g).max()), err_msg=name)
    assert isinstance(layer, blockrnn.LSTM)


def test_onnx_export(example, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                     # the block writes lstm.onnx
    ns = run(block("lengths = "), example)
    run(block("import onnxruntime"), ns)
    lstm, x, lengths = ns["lstm"], ns["x"], ns["lengths"]
    assert (tmp_path / "lstm.onnx").is_file()
    y, (h, c), _ = lstm.forward(x, sequence_length=lengths)   # the comment's claim
    for got, want in ((ns["y"][:, 0], y), (ns["h_n"], h), (ns["c_n"], c)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))
    for name, p in lstm.params.items():
        np.testing.assert_array_equal(ns["again"].params[name], p)
    deep = ns["deep"]
    T, B = x.shape[:2]
    assert ns["y2"].shape == (T, 2, B, 32) and ns["h2"].shape == ns["c2"].shape == (4, B, 32)
    y, (h, c), _ = deep.forward(x)
    for got, want in ((ns["y2"].transpose(0, 2, 1, 3).reshape(T, B, 64), y),
                      (ns["h2"], h), (ns["c2"], c)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))


def test_reverse_sequence_example(example):
    ns = run(block("lengths = "), example)
    run(block("x_rev = "), ns)
    lengths, x, hb = ns["lengths"], ns["x"], ns["h_backward"]
    import blockrnn
    for row, n in enumerate(lengths):   # each row's valid prefix, run backwards, alone
        fwd = blockrnn.block_lstm_v2(int(n), x[:n, row:row + 1][::-1], ns["cs0"][row:row + 1],
                                     ns["h0"][row:row + 1], ns["w"], ns["wci"], ns["wcf"],
                                     ns["wco"], ns["b"])
        np.testing.assert_allclose(hb[:n, row], fwd.h[::-1, 0], rtol=1e-5, atol=1e-6)
        assert not hb[n:, row].any()


def test_server_thread_limits():
    """The Threads section's server recipe: a serving thread's blockrnn calls run on
    that thread alone (its thread limit is 1) and OpenBLAS runs one thread; a limit
    entered in another thread does not reach it (GNU OpenMP's limit is per thread)."""
    import threading

    from threadpoolctl import threadpool_info

    from blockrnn import _config

    def limit_in_new_thread(fn):
        seen = []
        t = threading.Thread(target=fn, args=(seen,))
        t.start()
        t.join()
        return seen

    default = limit_in_new_thread(lambda seen: seen.append(_config.thread_limit()))
    namespace = run(block("from threadpoolctl import threadpool_limits"), {})
    try:
        blas = [d["num_threads"] for d in threadpool_info() if d["user_api"] == "blas"]
        assert blas and set(blas) == {1}
        with namespace["threadpool_limits"](limits=1, user_api="openmp"):  # this thread only
            assert _config.thread_limit() == 1
            assert limit_in_new_thread(lambda seen: seen.append(_config.thread_limit())) \
                == default
        served = limit_in_new_thread(lambda seen: namespace["serve"](
            lambda request: seen.append((request, _config.thread_limit())), [7, 8]))
        assert served == [(7, 1), (8, 1)]
        assert limit_in_new_thread(lambda seen: seen.append(_config.thread_limit())) == default
    finally:
        namespace["blas_limit"].restore_original_limits()

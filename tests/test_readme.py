"""The README's Python examples run as printed and give what their comments say.

Every ```python block of README.md is extracted from the file and executed verbatim, in
order, top to bottom, in ONE namespace (as a reader pasting them into one session would);
each test then checks the namespace as it stood right after the block it is about. The
environment is the one the blocks assume (tests/test_readme.py's ``readme`` fixture): the
variables torchrun sets for one rank and a scratch working directory.
"""
import os
import re
import socket

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


def run(code, namespace):
    exec(compile(code, README, "exec"), namespace)
    return namespace


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def readme(tmp_path_factory):
    """Every python block of the README, run as it stands, in order, in ONE namespace.

    Yields {"blocks": [(code, snapshot of the namespace after it)], "dir": the working
    directory the blocks ran in}. The environment is what the blocks assume: the
    variables torchrun sets (one rank) and a scratch working directory (the ONNX block
    writes files)."""
    workdir = tmp_path_factory.mktemp("readme")
    namespace, snapshots = {}, []
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(workdir)
        for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}.items():
            mp.setenv(key, value)
        try:
            for code in python_blocks():
                run(code, namespace)
                snapshots.append((code, dict(namespace)))
            yield {"blocks": snapshots, "dir": workdir}
        finally:
            if "blas_limit" in namespace:          # the Threads block's process-wide limit
                namespace["blas_limit"].restore_original_limits()


def after(readme, first_line):
    """The namespace right after the one block whose first line starts with `first_line`
    (the test fails, rather than passing vacuously, if the README no longer has it)."""
    found = [ns for code, ns in readme["blocks"] if code.startswith(first_line)]
    assert len(found) == 1, f"README: {len(found)} python blocks start with {first_line!r}"
    return found[0]


def test_every_block_runs_in_order(readme):
    firsts = [code.splitlines()[0] for code, _ in readme["blocks"]]
    known = ("import numpy as np", "lengths = ", "x_rev = ", "lstm = blockrnn.LSTM",
             "server = lstm.inference()",
             "import torch", "# train.py", "import jax", "from torch import nn",
             "import keras", "import onnxruntime", "from threadpoolctl import threadpool_limits")
    assert len(firsts) == len(python_blocks()) == len(known), firsts
    assert [f for f in firsts if not f.startswith(known)] == [], firsts


def test_inference_block(readme):
    """The served answer is the layer's forward, final states included (staleness and
    repacking: tests/test_inference.py)."""
    ns = after(readme, "server = lstm.inference()")
    y, (h, c), _ = ns["lstm"].forward(ns["x"], sequence_length=ns["lengths"])
    np.testing.assert_array_equal(ns["y_served"], y)
    np.testing.assert_array_equal(ns["h_served"], h)
    np.testing.assert_array_equal(ns["c_served"], c)
    assert ns["server"].nbytes > 0


@pytest.fixture
def example(readme):
    """The namespace after the README's first example (## Example)."""
    return after(readme, "import numpy as np\nimport blockrnn\n")


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


def test_sequence_length(readme):
    ns = after(readme, "lengths = ")
    lengths, fwd, B = ns["lengths"], ns["fwd"], ns["B"]
    assert 0 in lengths
    for row in range(B):
        last = fwd.h[lengths[row] - 1, row] if lengths[row] else ns["h0"][row]
        np.testing.assert_array_equal(ns["h_final"][row], last)
        assert not fwd.h[lengths[row]:, row].any()      # zero after each row's length


def test_training_in_numpy(readme):
    ns = after(readme, "lstm = blockrnn.LSTM")
    T, B = ns["T"], ns["B"]
    assert ns["y"].shape == (T, B, 32) and ns["dx"].shape == ns["x"].shape
    # The loop applied the gradients: the parameters are no longer the seed's.
    import blockrnn
    fresh = blockrnn.LSTM(16, 32, seed=0)
    assert set(fresh.params) == set(ns["lstm"].params)
    for name, p in ns["lstm"].params.items():
        np.testing.assert_allclose(p, fresh.params[name] - 0.1 * ns["lstm"].grads[name],
                                   rtol=1e-6, atol=1e-7)


def test_torch(readme):
    import torch
    ns = after(readme, "import torch\nimport blockrnn.torch")
    T, B = ns["T"], ns["B"]
    assert ns["y"].shape == (T, B, 32) and ns["h_n"].shape == (2, B, 32)   # the GRU's
    # The LSTM ran before y, h_n were rebound by the GRU; check its layout of states.
    lstm = ns["lstm"].eval()
    y, (h_n, c_n) = lstm(ns["x_bf"], (ns["h0_t"], ns["c0_t"]))
    assert y.shape == (B, T, 64) and h_n.shape == c_n.shape == (4, B, 32)
    torch.testing.assert_close(y[:, -1, :32], h_n[2])    # layer 1 forward: after step T-1
    torch.testing.assert_close(y[:, 0, 32:], h_n[3])     # layer 1 reverse: after step 0
    x_t = torch.from_numpy(ns["x"])
    want, _ = ns["nn_lstm"](x_t)
    torch.testing.assert_close(ns["converted"](x_t)[0], want)
    assert [n for n, _ in ns["converted"].named_parameters()] == \
        [n for n, _ in ns["nn_lstm"].named_parameters()]
    assert "weight_ci_l0" in dict(ns["peephole"].named_parameters())
    assert "w_ru_l0" in dict(ns["gru_block"].named_parameters())
    # the no-grad call ran the packed inference forward: the grad path's bits, 2 cells packed
    assert torch.equal(ns["y_served_t"], ns["y"]) and torch.equal(ns["h_served_t"], ns["h_n"])
    assert ns["gru"].inference_cache_info()["packings"] == 2


def test_ddp_block_single_rank(readme):
    """The train.py block ran as one torchrun rank: one SGD step, the group torn down."""
    import torch.distributed as dist
    ns = after(readme, "# train.py")
    assert ns["world"] == 1 and ns["y"].shape == (8, 20, 32)
    assert not dist.is_initialized()


def test_coming_from_torch(readme):
    ns = after(readme, "from torch import nn")
    assert ns["logits"].shape == (35, 20, 1000)
    assert ns["h_n"].shape == ns["c_n"].shape == (2, 20, 200)
    ref, ours = ns["reference"], ns["model"].rnn
    for (n, p), (m, q) in zip(ours.named_parameters(), ref.named_parameters()):
        assert n == m and p.shape == q.shape


def test_weight_import(readme):
    import torch
    ns = after(readme, "import keras")
    y, (h, c) = ns["y"], ns["state"]
    T, B = ns["T"], ns["B"]
    want, (h_t, c_t) = ns["torch_nn_lstm"](torch.from_numpy(ns["x"]))
    assert y.shape == (T, B, 64) and h.shape == c.shape == (4, B, 32)
    for got, ref in ((y, want), (h, h_t), (c, c_t)):
        np.testing.assert_allclose(got, ref.detach().numpy(), rtol=1e-5, atol=1e-5)


def test_jax(readme):
    import blockrnn
    ns = after(readme, "import jax\n")
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


def test_onnx_export(readme):
    ns = after(readme, "import onnxruntime")
    lstm, x, lengths = ns["lstm"], ns["x"], ns["lengths"]
    assert (readme["dir"] / "lstm.onnx").is_file()      # the block wrote it
    y, (h, c), _ = lstm.forward(x, sequence_length=lengths)   # the comment's claim
    for got, want in ((ns["y"][:, 0], y), (ns["h_n"], h), (ns["c_n"], c)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))
    for name, p in lstm.params.items():
        np.testing.assert_array_equal(ns["again"].params[name], p)
    np.testing.assert_array_equal(ns["y_served_onnx"], y)     # the served model: forward's bits
    assert ns["served"].packings == 1
    deep = ns["deep"]
    T, B = x.shape[:2]
    assert ns["y2"].shape == (T, 2, B, 32) and ns["h2"].shape == ns["c2"].shape == (4, B, 32)
    y, (h, c), _ = deep.forward(x)
    for got, want in ((ns["y2"].transpose(0, 2, 1, 3).reshape(T, B, 64), y),
                      (ns["h2"], h), (ns["c2"], c)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))


def test_reverse_sequence_example(readme):
    ns = after(readme, "x_rev = ")
    lengths, x, hb = ns["lengths"], ns["x"], ns["h_backward"]
    import blockrnn
    for row, n in enumerate(lengths):   # each row's valid prefix, run backwards, alone
        fwd = blockrnn.block_lstm_v2(int(n), x[:n, row:row + 1][::-1], ns["cs0"][row:row + 1],
                                     ns["h0"][row:row + 1], ns["w"], ns["wci"], ns["wcf"],
                                     ns["wco"], ns["b"])
        np.testing.assert_allclose(hb[:n, row], fwd.h[::-1, 0], rtol=1e-5, atol=1e-6)
        assert not hb[n:, row].any()


def test_server_thread_limits(readme):
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
    namespace = after(readme, "from threadpoolctl import threadpool_limits")
    if True:   # the block's blas_limit is active until the readme fixture's teardown
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

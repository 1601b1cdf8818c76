"""Smoke tests of the benchmark harness (blockrnn.bench): tiny shapes, one repeat, no timed
assertions. They pass whichever peers (TF, torch, ONNX Runtime, matplotlib) are installed:
a missing peer must give its "not importable" line instead of rows."""
import json
import math
from collections import namedtuple

import numpy as np

import blockrnn

from blockrnn.bench import peers, run, targets, threads

TINY = ["--quick", "--repeats", "1", "--shapes", "5,2,4,6", "--cell-shape", "1,4,4",
        "--sgemm-size", "64", "--settle", "0"]

# The rows each peer must produce when installed (blockrnn: every workload).
EXPECTED = {
    "blockrnn": set(peers.WORKLOADS),
    "tf": {"lstm_fwd", "lstm_fwdbwd", "lstm_cell", "gru_cell"},
    "torch": set(peers.WORKLOADS),
    "ort": {"lstm_fwd", "gru_fwd"},
    "jax": set(peers.SEQUENCE_WORKLOADS) - set(peers.STACKED_WORKLOADS),
}
VERSION_KEY = {"tf": "tensorflow", "torch": "torch", "ort": "onnxruntime", "jax": "jax"}

_GRU = namedtuple("BlockGRUOutput", "r u c h")


def _loop_block_gru(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c):
    """block_gru's contract as a loop of gru_block_cell (until blockrnn has the real one)."""
    outs, h = [], h_prev
    for t in range(seq_len_max):
        step = blockrnn.gru_block_cell(x[t], h, w_ru, w_c, b_ru, b_c)
        outs.append(step)
        h = step.h
    return _GRU(*(np.stack([getattr(o, f) for o in outs]) for f in _GRU._fields))


def _loop_block_gru_grad(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, h, h_grad):
    d_x, d_h = np.zeros_like(x), np.zeros_like(h_prev)
    d_params = [np.zeros_like(a) for a in (w_ru, w_c, b_ru, b_c)]
    for t in reversed(range(seq_len_max)):
        g = blockrnn.gru_block_cell_grad_full(x[t], h[t - 1] if t else h_prev, w_ru, w_c,
                                              b_ru, b_c, r[t], u[t], c[t], h_grad[t] + d_h)
        d_x[t], d_h = g.d_x, g.d_h_prev
        for acc, value in zip(d_params, g[2:]):
            acc += value
    return (d_x, d_h, *d_params)


def _with_gru(monkeypatch):
    if not hasattr(blockrnn, "block_gru"):
        monkeypatch.setattr(blockrnn, "block_gru", _loop_block_gru, raising=False)
    if not hasattr(blockrnn, "block_gru_grad"):
        monkeypatch.setattr(blockrnn, "block_gru_grad", _loop_block_gru_grad, raising=False)


def test_table_rows_columns_and_ratios(tmp_path, capsys, monkeypatch):
    _with_gru(monkeypatch)
    path = tmp_path / "bench.json"
    assert run.main(TINY + ["--json", str(path)]) == 0
    out = capsys.readouterr().out
    results = json.loads(path.read_text())

    # Header and table layout.
    assert f"blockrnn {blockrnn.__version__}" in out
    assert "sgemm roofline" in out and "threads per library" in out
    assert "\ntargets (roofline floor" in out and "issue" not in out
    assert len(results["targets"]) == len(targets.TARGETS)
    header = [line for line in out.splitlines() if line.startswith("workload  ")]
    assert len(header) == 1
    for column in run.COLUMNS:
        assert column in header[0]
    table = out[out.index(header[0]):].splitlines()
    body = [line for line in table[2:] if line.strip()][:len(results["rows"])]
    assert len(body) == len(results["rows"])

    # Rows: every installed peer where it has the op; a missing peer says so in one line.
    rows = results["rows"]
    shapes = {(5, 2, 4, 6)}
    for impl, workloads in EXPECTED.items():
        installed = impl == "blockrnn" or \
            results["header"][VERSION_KEY[impl]] != "not installed"
        if not installed:
            assert any("not importable" in m and peers.IMPL_TITLES[impl] in m
                       for m in results["messages"]), impl
            assert not any(r["impl"] == impl for r in rows)
            continue
        for workload in workloads:
            wanted = [(1, 4, 4)] if workload in peers.CELL_WORKLOADS else shapes
            got = {tuple(r["shape"]) for r in rows
                   if r["impl"] == impl and r["workload"] == workload}
            assert got == set(wanted), (impl, workload, got)
    assert all(p["ok"] for p in results["parity"]), results["parity"]
    assert not results["failed"]

    # Derived columns come from the measured times.
    peak = results["roofline"]["gflops"]
    assert peak > 0
    for r in rows:
        assert r["best_ms"] > 0 and r["best_ms"] <= r["median_ms"]
        assert len(r["samples_ms"]) == 1 and r["samples_ms"][0] == r["best_ms"]
        T, B, I, H = ((1, *r["shape"]) if r["workload"] in peers.CELL_WORKLOADS
                      else r["shape"])
        assert r["flops"] == peers.flops(r["workload"], T, B, I, H)
        assert math.isclose(r["gflops"], r["flops"] / (r["best_ms"] * 1e-3) / 1e9)
        assert math.isclose(r["sgemm_share"], r["gflops"] / peak)
        base = [b for b in rows if b["impl"] == "blockrnn" and b["workload"] == r["workload"]
                and b["shape"] == r["shape"]]
        if r["impl"] == "blockrnn":
            assert r["ratio_blockrnn_over_peer"] is None
            assert r["tracemalloc_peak_bytes"] > 0
            assert r["memory_bound_bytes"] == peers.memory_bound(r["workload"], T, B, I, H)
        else:
            assert math.isclose(r["ratio_blockrnn_over_peer"],
                                base[0]["best_ms"] / r["best_ms"])
            assert r["tracemalloc_peak_bytes"] is None


def test_quick_keeps_the_pause_between_samples():
    """--quick shortens the run but still lets the previous implementation's spinning
    threads go idle before each sample; --settle sets the pause."""
    assert run.Run(run.parse_args(["--quick"]), None, None).settle == run.measure.SETTLE_S > 0
    assert run.Run(run.parse_args(["--quick", "--settle", "0.05"]), None, None).settle == 0.05


def test_flops_and_memory_bound_formulas():
    assert peers.flops("lstm_fwd", 100, 32, 256, 256) == 2 * 100 * 32 * 512 * 4 * 256
    assert peers.flops("lstm_fwdbwd", 2, 3, 4, 5) == 3 * peers.flops("lstm_fwd", 2, 3, 4, 5)
    assert peers.flops("gru_fwd", 2, 3, 4, 5) == 2 * 2 * 3 * 9 * 3 * 5
    assert peers.flops("gru_cell", 1, 1, 4, 5) == 2 * 1 * 9 * 3 * 5
    # T=2, B=3, I=4, H=5: outputs 7*T*B*H, workspace T*B*4H + B*H
    assert peers.memory_bound("lstm_fwd", 2, 3, 4, 5) == 4 * (7 * 30 + 2 * 3 * 20 + 15)
    assert peers.memory_bound("gru_fwd", 2, 3, 4, 5) == 4 * (4 * 30 + 2 * 3 * 20 + 15)


def test_a_failed_parity_check_excludes_the_row_loudly(capsys, monkeypatch):
    real_build = peers.build

    def build(workload, problem, found, wanted=peers.IMPLS):
        impls, messages = real_build(workload, problem, found, ("blockrnn",))
        wrong = peers.Impl("ort", "a wrong implementation", impls[0].run,
                           lambda: peers.Parity(False, "max|h - h_blockrnn| = 1.0e+00"))
        return impls + [wrong], messages

    monkeypatch.setattr(peers, "build", build)
    assert run.main(TINY + ["--impls", "blockrnn", "--workloads", "lstm_fwd"]) == 1
    out = capsys.readouterr().out
    assert "!!! PARITY FAILURE LSTM fwd" in out
    assert "ONNX Runtime" not in out.split("workload  ")[-1].split("implementations:")[0]


def test_thread_scaling_mode(tmp_path, capsys):
    path = tmp_path / "threads.json"
    assert run.main(["--threads", "--thread-counts", "1,2", "--thread-shape", "4,1,3,5",
                     "6,2,3,5", "--thread-duration", "0.05", "--blas-threads", "default,1",
                     "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "sequences/s" in out and "speed-up" in out
    assert "target:" not in out   # these shapes have no thread-scaling target
    rows = json.loads(path.read_text())["thread_scaling"]
    assert [(tuple(r["shape"]), r["blas_threads"], r["threads"]) for r in rows] == \
        [(s, blas, n) for s in ((4, 1, 3, 5), (6, 2, 3, 5)) for blas in ("default", 1)
         for n in (1, 2)]
    rows = rows[:4]
    for r in rows:
        assert r["calls"] >= r["threads"] and r["bitwise_equal"]
        assert math.isclose(r["sequences_per_s"], r["calls"] / r["seconds"])
    assert rows[0]["speedup"] == 1.0 and rows[2]["speedup"] == 1.0
    assert math.isclose(rows[1]["speedup"], rows[1]["sequences_per_s"]
                        / rows[0]["sequences_per_s"])
    assert threads.main(["--counts", "1", "--shape", "2,1,2,2", "--duration", "0.02",
                         "--blas-threads", "1"]) == 0


def test_plot_or_a_clear_error(tmp_path, capsys):
    png = tmp_path / "bench.png"
    status = run.main(TINY + ["--impls", "blockrnn", "--workloads", "lstm_fwd",
                              "--plot", str(png)])
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert status == 2
        assert "--plot needs matplotlib" in capsys.readouterr().err
    else:
        assert status == 0
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _row(workload, shape, impl, best_ms, flops=None):
    return {"workload": workload, "shape": list(shape), "impl": impl, "best_ms": best_ms,
            "flops": flops, "sgemm_share": None}


def test_targets_are_judged_from_the_rows():
    """Each target is met, missed or not measured from the same rows as the table;
    the floor is the ratio at the sgemm peak."""
    shape = (100, 32, 256, 256)
    flops = peers.flops("lstm_fwdbwd", *shape)
    own = _row("lstm_fwdbwd", shape, "blockrnn", 60.0, flops)
    own["sgemm_share"] = 0.74
    results = {"roofline": {"gflops": 200.0}, "rows": [
        own, _row("lstm_fwdbwd", shape, "tf", 250.0), _row("lstm_fwdbwd", shape, "torch", 90.0),
        _row("lstm_cell", (1, 32, 32), "blockrnn", 0.002),
        _row("lstm_cell", (1, 32, 32), "tf", 0.02)]}
    wanted = (("lstm_fwdbwd", shape, "tf", 0.2), ("lstm_fwdbwd", shape, "torch", 0.67),
              ("lstm_fwdbwd", shape, "sgemm", 0.75), ("lstm_fwd", shape, "ort", 1.5),
              ("lstm_cell", (1, 32, 32), "tf", 0.05))
    v = targets.evaluate(results, wanted)
    assert [x["met"] for x in v] == [False, True, False, None, False]
    assert math.isclose(v[0]["value"], 60 / 250) and math.isclose(v[1]["value"], 60 / 90)
    assert math.isclose(v[0]["floor"], flops / 200e9 / 0.250)
    assert v[2]["value"] == 0.74 and v[2]["floor"] is None
    assert v[3]["value"] is None and v[4]["floor"] is None and math.isclose(v[4]["value"], 0.1)
    text = targets.format_verdicts(v)
    assert "LSTM fwd+bwd 100,32,256,256: blockrnn / TensorFlow <= 0.2" in text
    assert "0.240  MISSED  (roofline floor" in text and "0.667  met" in text
    assert "sgemm share >= 75%" in text and "74.0%  MISSED" in text
    assert "not measured" in text and "1 of 4 measured targets met" in text

    rows = [{"threads": 1, "sequences_per_s": 100.0}, {"threads": 2, "sequences_per_s": 179.0}]
    one, mid = (50, 1, 128, 128), (100, 32, 256, 256)
    assert targets.thread_verdict(rows, one) == (
        "target: 2 threads >= 1.8x one thread's throughput at 50,1,128,128 "
        "(BLAS as configured): 1.79x, MISSED")
    assert targets.thread_verdict(rows, mid, "default").endswith("1.79x, met")   # >= 0.95
    assert targets.thread_verdict(rows, mid, 1).endswith("(threadpool_limits(1)): 1.79x, MISSED")
    rows[1]["sequences_per_s"] = 180.0
    assert targets.thread_verdict(rows, one).endswith("1.80x, met")
    assert targets.thread_verdict(rows, mid, 1).endswith("1.80x, met")
    assert targets.thread_verdict(rows, one, 1) is None        # no target there
    assert targets.thread_verdict(rows[:1], one) is None
    assert all(t[2] == "sgemm" or t[2] in peers.IMPLS for t in targets.TARGETS)


def test_the_targets_table():
    """The performance targets, as the project states them (ratios: blockrnn / peer)."""
    got = {(w, s, p): b for w, s, p, b in targets.TARGETS}
    assert len(got) == len(targets.TARGETS) == 19
    big, mid, long_, one = (100, 64, 512, 512), (100, 32, 256, 256), (200, 16, 128, 256), \
        (50, 1, 128, 128)
    assert got[("lstm_fwd", big, "ort")] == 1.0
    assert got[("lstm_fwd", mid, "ort")] == got[("lstm_fwd", long_, "ort")] == 1.1
    for s in (mid, big, long_):
        assert got[("gru_fwd", s, "ort")] == 1.0
    for s in (mid, big, long_, one):
        assert got[("lstm_fwdbwd", s, "torch")] == (1.0 if s != one else 0.5)
        assert got[("gru_fwdbwd", s, "torch")] == 0.7
    assert got[("lstm_fwdbwd", big, "sgemm")] == 0.85
    assert got[("lstm_fwd", one, "ort")] == got[("gru_fwd", one, "ort")] == 0.8
    # issue 21: the 2-layer bidirectional LSTM module against nn.LSTM's
    assert got[("lstm2bi_fwd", mid, "torch")] == got[("lstm2bi_fwdbwd", mid, "torch")] == 1.0
    assert set(targets.THREAD_TARGETS) == {(one, "default", 1.8), (mid, "default", 0.95),
                                           (mid, 1, 1.8)}


def test_stacked_rows_default_shape_and_flops(tmp_path, capsys, monkeypatch):
    """The 2-layer bidirectional rows (blockrnn.torch.LSTM vs nn.LSTM) run at
    STACKED_SHAPES only unless --shapes is given; their flops sum both layers (layer 1
    reads 2H) and both directions."""
    assert peers.flops("lstm2bi_fwd", 100, 32, 256, 256) == \
        2 * 2.0 * 100 * 32 * 4 * 256 * ((256 + 256) + (512 + 256))
    assert peers.flops("lstm2bi_fwdbwd", 5, 2, 4, 6) == 3 * peers.flops("lstm2bi_fwd", 5, 2,
                                                                       4, 6)
    monkeypatch.setattr(run, "DEFAULT_SHAPES", ((5, 2, 4, 6), (4, 3, 4, 6)))
    monkeypatch.setattr(run, "STACKED_SHAPES", ((4, 3, 4, 6),))
    path = tmp_path / "bench.json"
    assert run.main(["--quick", "--repeats", "1", "--sgemm-size", "64", "--settle", "0",
                     "--workloads", "lstm_fwd", "lstm2bi_fwd", "lstm2bi_fwdbwd",
                     "--impls", "blockrnn", "torch", "--json", str(path)]) == 0
    results = json.loads(path.read_text())
    got = {(r["workload"], tuple(r["shape"]), r["impl"]) for r in results["rows"]}
    assert got == {(w, s, i) for i in ("blockrnn", "torch") for w, s in (
        ("lstm_fwd", (5, 2, 4, 6)), ("lstm_fwd", (4, 3, 4, 6)),
        ("lstm2bi_fwd", (4, 3, 4, 6)), ("lstm2bi_fwdbwd", (4, 3, 4, 6)))}
    checked = {(p["workload"], p["impl"]) for p in results["parity"] if p["ok"]}
    assert {("lstm2bi_fwd", "torch"), ("lstm2bi_fwdbwd", "torch")} <= checked
    assert "LSTM 2-layer bidi fwd+bwd" in capsys.readouterr().out

"""Smoke tests of the benchmark harness (blockrnn.bench): tiny shapes, one repeat, no timed
assertions. They pass whichever peers (TF, torch, ONNX Runtime, matplotlib) are installed:
a missing peer must give its "not importable" line instead of rows."""
import json
import math
import os

import pytest

import blockrnn

from blockrnn.bench import measure, peers, run, serve, targets, threads, worker

TINY = ["--quick", "--rounds", "1", "--shapes", "5,2,4,6", "--cell-shape", "1,4,4",
        "--sgemm-size", "64", "--settle", "0"]

# The rows each peer must produce when installed (blockrnn: every workload).
EXPECTED = {
    "blockrnn": set(peers.WORKLOADS),
    "tf": {"lstm_fwd", "lstm_fwdbwd", "lstm_cell", "gru_cell"},
    "torch": set(peers.WORKLOADS) - set(peers.INFER_WORKLOADS),
    "ort": {"lstm_fwd", "gru_fwd", "lstm_infer", "gru_infer"},
    "jax": set(peers.SEQUENCE_WORKLOADS) - set(peers.STACKED_WORKLOADS)
    - set(peers.MODEL_WORKLOADS) - set(peers.INFER_WORKLOADS),
}
VERSION_KEY = {"tf": "tensorflow", "torch": "torch", "ort": "onnxruntime", "jax": "jax"}

def test_table_rows_columns_and_ratios(tmp_path, capsys):
    """One round on all cores and one core: every installed peer's rows in both tables,
    each implementation timed in its own process, the one-core workers pinned."""
    path = tmp_path / "bench.json"
    assert run.main(TINY + ["--json", str(path)]) == 0
    out = capsys.readouterr().out
    results = json.loads(path.read_text())

    # Header and table layout: two tables, the scaling table, the model lines.
    assert f"blockrnn {blockrnn.__version__}" in out
    assert "sgemm roofline (all cores)" in out and "sgemm roofline (one core)" in out
    assert "\ntargets (medians" in out and "issue" not in out
    assert "scaling, one core -> all cores" in out
    assert "LSTM in a torch model, train step (per step" in out
    assert results["header"]["modes"] == ["all", "one"]
    n_spread = 2
    assert len(results["targets"]) == len(targets.TARGETS) + n_spread
    headers = [line for line in out.splitlines() if line.startswith("workload  ")]
    assert len(headers) == 3       # all cores, one core, scaling
    for column in run.COLUMNS:
        assert column in headers[0]
    assert "peak RSS +MB" not in headers[1]    # memory: measured in the first mode only
    table = out[out.index(headers[0]):].splitlines()
    rows_all = [r for r in results["rows"] if r["mode"] == "all"]
    body = [line for line in table[2:] if line.strip()][:len(rows_all)]
    assert len(body) == len(rows_all)

    # Rows: every installed peer where it has the op, in both modes; a missing peer
    # says so in one line.
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
        for mode in ("all", "one"):
            for workload in workloads:
                wanted = [(1, 4, 4)] if workload in peers.CELL_WORKLOADS else shapes
                got = {tuple(r["shape"]) for r in rows if r["impl"] == impl
                       and r["workload"] == workload and r["mode"] == mode}
                assert got == set(wanted), (impl, workload, mode, got)
    assert all(p["ok"] for p in results["parity"]), results["parity"]
    assert ("lstm_model", "torch") in {(p["workload"], p["impl"]) for p in results["parity"]}
    assert not results["failed"]

    # Each implementation in its own process, none of them this one; one-core workers
    # pinned to one CPU with every runtime at 1 thread; a peer's worker imports no
    # other peer (TensorFlow may import JAX itself; blockrnn.torch needs torch).
    workers = results["workers"]
    assert {w["impl"] for w in workers} == {r["impl"] for r in rows}
    pids = [w["pid"] for w in workers]
    assert len(set(pids)) == len(pids) and os.getpid() not in pids
    modules = {"tf": "tensorflow", "torch": "torch", "ort": "onnxruntime", "jax": "jax"}
    for w in workers:
        if w["mode"] == "one":
            assert len(w["affinity"]) == 1
            assert all(v == 1 for v in w["thread_settings"].values() if isinstance(v, int)), w
        for peer, module in modules.items():
            if peer != w["impl"] and not (w["impl"] == "tf" and module == "jax") \
                    and not (w["impl"] == "blockrnn" and module == "torch"):
                assert not w["modules"][module], (w["impl"], module)
    for r in rows:
        assert set(r["pids"]) <= {w["pid"] for w in workers
                                  if w["impl"] == r["impl"] and w["mode"] == r["mode"]}

    # Derived columns come from the measured times (medians).
    for r in rows:
        peak = results["roofline"][r["mode"]]["gflops"]
        assert peak > 0
        assert 0 < r["best_ms"] <= r["median_ms"]
        assert len(r["rounds_ms"]) == 1 and r["rounds_ms"][0] == r["best_ms"]
        assert math.isclose(r["spread"], r["median_ms"] / r["best_ms"] - 1)
        T, B, I, H = ((1, *r["shape"]) if r["workload"] in peers.CELL_WORKLOADS
                      else r["shape"])
        assert r["flops"] == peers.flops(r["workload"], T, B, I, H)
        assert math.isclose(r["gflops"], r["flops"] / (r["median_ms"] * 1e-3) / 1e9)
        assert math.isclose(r["sgemm_share"], r["gflops"] / peak)
        assert r["cpu_per_wall"] >= 0 and r["threads"] >= 1
        base = [b for b in rows if b["impl"] == "blockrnn" and b["workload"] == r["workload"]
                and b["shape"] == r["shape"] and b["mode"] == r["mode"]]
        if r["impl"] == "blockrnn":
            assert r["ratio_blockrnn_over_peer"] is None
            if r["mode"] == "all":
                assert r["tracemalloc_peak_bytes"] > 0
            assert r["memory_bound_bytes"] == peers.memory_bound(r["workload"], T, B, I, H)
        else:
            assert math.isclose(r["ratio_blockrnn_over_peer"],
                                base[0]["median_ms"] / r["median_ms"])
            assert r["tracemalloc_peak_bytes"] is None
    scaling = run.scaling_rows(results)
    assert len(scaling) == len(rows_all)
    for s in scaling:
        assert math.isclose(s["scaling"], s["one_ms"] / s["all_ms"])


def test_worker_output_and_one_core_pinning():
    """A worker's output: its pid, affinity, thread settings, imported libraries and per
    task the timed samples; a one-core worker is pinned to one CPU and every runtime it
    loads (blockrnn's OpenMP, the BLAS libraries, torch) uses one thread."""
    spec = {"impl": "blockrnn", "tasks": [{"workload": "lstm_fwd", "shape": [4, 2, 3, 5]},
                                          {"workload": "lstm_model", "shape": [4, 2, 3, 5]},
                                          {"workload": "gru_cell", "shape": [1, 3, 5]}],
            "reps": 3, "budget_s": 10.0, "sample_target_s": 0.01, "one_core": True,
            "memory": True}
    out = worker.launch(spec)
    assert out["pid"] != os.getpid() and out["impl"] == "blockrnn" and out["one_core"]
    assert out["affinity"] == [worker.one_core_cpu()]
    settings = out["thread_settings"]
    assert settings["torch num_threads"] == settings["torch num_interop_threads"] == 1
    assert any(k.startswith("openmp") for k in settings)
    assert all(v == 1 for v in settings.values()), settings
    assert out["modules"] == {"tensorflow": False, "torch": True, "onnxruntime": False,
                              "jax": False}
    for res, task in zip(out["results"], spec["tasks"]):
        assert res["error"] is None and res["workload"] == task["workload"]
        assert len(res["times_s"]) == len(res["cpu_s"]) == 3      # reps, within the budget
        assert all(t > 0 for t in res["times_s"])
        assert res["threads"] == 1
        assert res["tracemalloc_peak_bytes"] >= 0
    # a sample is a loop of calls lasting sample_target_s: several of these short calls
    assert out["results"][0]["calls_per_sample"] > 1
    assert out["results"][2]["calls_per_sample"] > 1

    # The sgemm worker imports no peer; on all cores it keeps every usable CPU; a
    # workload it cannot build is reported as that task's error.
    spec = {"impl": "sgemm", "tasks": [{"workload": "sgemm", "shape": [32]}], "reps": 2,
            "budget_s": 0.0, "one_core": False}
    out = worker.launch(spec)
    assert len(out["results"][0]["times_s"]) == 1      # budget 0: one sample
    assert not any(out["modules"].values())
    assert len(out["affinity"]) == measure.usable_cpus()
    out = worker.launch({"impl": "ort", "tasks": [{"workload": "lstm_fwdbwd",
                                                    "shape": [4, 2, 3, 5]}]})
    assert out["results"][0]["error"]


def test_worker_environment_and_timing_loop():
    env = worker.child_env(True)
    for key, value in worker.ONE_CORE_ENV.items():
        assert env[key] == value or (key == "XLA_FLAGS" and env[key].endswith(value))
    assert "--xla_cpu_multi_thread_eigen=false" in env["XLA_FLAGS"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(blockrnn.__file__)))
    assert env["PYTHONPATH"].split(os.pathsep)[0] == root
    assert worker.child_env(False).get("OMP_NUM_THREADS") == os.environ.get("OMP_NUM_THREADS")
    calls = []
    walls, cpus = worker.time_task(lambda: calls.append(1), reps=4, budget=60.0, calls=3)
    assert len(walls) == len(cpus) == 4 and len(calls) == 12
    walls, _ = worker.time_task(lambda: None, reps=4, budget=0.0)
    assert len(walls) == 1


def test_options():
    opts = run.parse_args(["--only", "blockrnn,pytorch,onnxruntime", "--repeats", "3"])
    assert opts.impls == ["blockrnn", "torch", "ort"] and opts.rounds == 3
    assert run.modes_of(opts) == ("all", "one")
    assert run.modes_of(run.parse_args(["--cores", "one"])) == ("one",)
    quick = run.Run(run.parse_args(["--quick"]), None)
    assert (quick.rounds, quick.reps) == (2, 2)
    full = run.Run(run.parse_args([]), None)
    assert (full.rounds, full.big_rounds, full.reps) == (7, 5, 5)
    assert full.rounds_of("lstm_fwdbwd", (100, 64, 512, 512)) == 5
    assert full.rounds_of("gru_fwd", (100, 32, 256, 256)) == 7
    assert full.rounds_of("gru_cell", (1, 32, 32)) == 7
    assert run.Run(run.parse_args(["--rounds", "3"]), None).big_rounds == 3
    assert run.main(["--rounds", "0"]) == 2


def test_a_peer_worker_imports_its_peer_before_blockrnn():
    """The first module to load GNU OpenMP sets its wait policy for the process: a peer's
    worker imports the peer (PEER_MODULES) before the blockrnn package, so PyTorch's pool
    runs on its own policy; blockrnn's worker runs as -m."""
    import subprocess
    import sys
    own = worker.peer_first_command("blockrnn.bench.worker", "blockrnn", ["--x"])
    assert own[1:] == ["-m", "blockrnn.bench.worker", "--x"]
    cmd = worker.peer_first_command("blockrnn.bench.worker", "torch", ["--x"])
    assert cmd[1] == "-c" and cmd[3:] == ["torch", "blockrnn.bench.worker", "--x"]
    # the bootstrap: the peer first, then the module as __main__ with the remaining args
    probe = ("import sys; print(sorted(k for k in ('json', 'blockrnn') if k in "
             "sys.modules), sys.argv[1:])")
    out = subprocess.run(
        [sys.executable, "-c", cmd[2].replace("runpy.run_module(module, run_name='__main__', "
                                              "alter_sys=True)", probe), "json", "mod", "--x"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["['json']", "['--x']"]


def test_warm_up_calls_for_the_given_time():
    """The worker's warm-up: at least one call, and calls until the time has passed."""
    import time
    calls = []
    worker.warm_up(lambda: calls.append(time.perf_counter()), 0.0)
    assert len(calls) == 1
    start = time.perf_counter()
    worker.warm_up(lambda: calls.append(time.perf_counter()) or time.sleep(0.002), 0.02)
    end = time.perf_counter()
    # it returns only once the time has passed, having called fn again and again (when
    # the last call began depends on how long the host's sleeps overshoot: not asserted)
    assert len(calls) > 2 and end - start >= 0.02
    assert calls[-1] - start < 0.02 + 0.5   # and it stops: no call long after the time


def _scripted_faults(per_call):
    """A function and a fault counter for warm_up: the k-th call of the function takes
    per_call[k] faults (the last entry repeats). Deterministic, unlike the process's own
    count (under the sanitizer build's allocator a Python call can fault a page in)."""
    count, calls = [0], [0]

    def fn():
        count[0] += per_call[min(calls[0], len(per_call) - 1)]
        calls[0] += 1
    return fn, lambda: count[0]


@pytest.mark.parametrize("per_call, seconds, expected", [
    ([500, 300, 700, 200, 0], 0.0, 5),       # a heap settling: the first clean call ends it
    ([0], 0.0, 2),                           # settled from the start: after the first call
    ([0, 0, 0, 90, 80, 0], 0.0, 2),          # (one clean call after the first is enough)
    ([90, 0, 80, 0], 0.0, 2),
    ([900, 938, 938, 938, 5], 0.0, 4),       # fresh memory at every call: 3 equal counts
    ([20000, 10500, 8139, 8127, 8141], 0.0, 5),   # steady within 2% (PyTorch's allocator)
    ([1000, 900, 800, 700, 600, 0], 0.0, 6),      # falling by 10% a call: not steady
])
def test_warm_up_goes_on_until_the_heap_has_settled(per_call, seconds, expected):
    """After its time, the warm-up calls on while calls still fault new pages in (a heap
    that has not settled), and stops at the first call after the first that faults none,
    or once STEADY_CALLS calls in a row took the same number of faults (memory mapped
    afresh at every call is the steady state)."""
    fn, faults = _scripted_faults(per_call)
    assert worker.warm_up(fn, seconds, max_seconds=5.0, faults=faults) == expected


def test_warm_up_counts_the_calls_of_its_time_too():
    """A call made while the time runs counts: one that ends the time clean ends it."""
    import time
    count, calls = [0], [0]

    def fn():
        calls[0] += 1
        count[0] += 100 if calls[0] <= 2 else 0     # two faulting calls, then clean
        time.sleep(0.002)
    n = worker.warm_up(fn, 0.02, max_seconds=5.0, faults=lambda: count[0])
    assert calls[0] == n and 2 < n < 0.02 / 0.002 + 2   # no call after the time's last


def test_warm_up_stops_at_max_seconds_and_without_it_after_its_time():
    import time
    count = [0]

    def fn():                                 # never settles: a new count at every call
        count[0] += 1000 + 100 * (count[0] % 7)
    start = time.perf_counter()
    calls = worker.warm_up(fn, 0.0, max_seconds=0.05, faults=lambda: count[0])
    assert calls > 3 and 0.05 <= time.perf_counter() - start < 0.05 + 0.5
    assert worker.warm_up(fn, 0.0, faults=lambda: count[0]) == 1   # no max_seconds: time


def test_minor_faults_counts_fresh_pages_touched():
    """warm_up's default counter sees a call that maps and touches fresh pages."""
    import mmap
    before = worker.minor_faults()
    with mmap.mmap(-1, 64 * mmap.PAGESIZE) as m:
        for page in range(64):
            m[page * mmap.PAGESIZE] = 1
    assert worker.minor_faults() - before >= 64


def test_flops_and_memory_bound_formulas():
    assert peers.flops("lstm_fwd", 100, 32, 256, 256) == 2 * 100 * 32 * 512 * 4 * 256
    assert peers.flops("lstm_fwdbwd", 2, 3, 4, 5) == 3 * peers.flops("lstm_fwd", 2, 3, 4, 5)
    assert peers.flops("gru_fwd", 2, 3, 4, 5) == 2 * 2 * 3 * 9 * 3 * 5
    assert peers.flops("gru_cell", 1, 1, 4, 5) == 2 * 1 * 9 * 3 * 5
    # T=2, B=3, I=4, H=5: outputs 7*T*B*H, workspace T*B*4H + B*H
    assert peers.memory_bound("lstm_fwd", 2, 3, 4, 5) == 4 * (7 * 30 + 2 * 3 * 20 + 15)
    assert peers.memory_bound("gru_fwd", 2, 3, 4, 5) == 4 * (4 * 30 + 2 * 3 * 20 + 15)
    # the inference forward: y, the final states, T*B*4H of hoisted projection, [2, B, H]
    assert peers.memory_bound("lstm_infer", 2, 3, 4, 5) == 4 * (30 + 2 * 15 + 2 * 3 * 20 + 30)
    assert peers.memory_bound("gru_infer", 2, 3, 4, 5) == 4 * (30 + 15 + 2 * 3 * 20 + 30)


def test_a_failed_parity_check_excludes_the_row_loudly(capsys, monkeypatch):
    real_build = peers.build

    def build(workload, problem, found, wanted=peers.IMPLS):
        impls, messages = real_build(workload, problem, found, ("blockrnn",))
        wrong = peers.Impl("ort", "a wrong implementation", impls[0].run,
                           lambda: peers.Parity(False, "max|h - h_blockrnn| = 1.0e+00"))
        return impls + [wrong], messages

    monkeypatch.setattr(peers, "build", build)
    assert run.main(TINY + ["--impls", "blockrnn", "--workloads", "lstm_fwd",
                            "--cores", "one"]) == 1
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
                              "--cores", "all", "--plot", str(png)])
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert status == 2
        assert "--plot needs matplotlib" in capsys.readouterr().err
    else:
        assert status == 0
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _row(workload, shape, impl, median_ms, flops=None, mode="all", best_ms=None):
    return {"mode": mode, "workload": workload, "shape": list(shape), "impl": impl,
            "median_ms": median_ms, "best_ms": best_ms or median_ms, "flops": flops,
            "sgemm_share": None, "shape_label": ",".join(map(str, shape))}


def test_targets_are_judged_from_the_rows():
    """Each target is met, missed or not measured from the medians of the same rows as
    the tables; the floor is the ratio at the mode's sgemm peak; scaling is one core /
    all cores (n/a on one CPU); the spread target names the worst blockrnn row."""
    shape = (100, 32, 256, 256)
    flops = peers.flops("lstm_fwdbwd", *shape)
    own = _row("lstm_fwdbwd", shape, "blockrnn", 60.0, flops, best_ms=50.0)
    own["sgemm_share"] = 0.74
    results = {"header": {"usable_cpus": 2},
               "roofline": {"all": {"gflops": 200.0}, "one": {"gflops": 100.0}}, "rows": [
        own, _row("lstm_fwdbwd", shape, "tf", 250.0, best_ms=200.0),
        _row("lstm_fwdbwd", shape, "torch", 90.0),
        _row("lstm_fwdbwd", shape, "blockrnn", 100.0, flops, "one", best_ms=95.0),
        _row("lstm_fwdbwd", shape, "torch", 110.0, flops, "one"),
        _row("lstm_cell", (1, 32, 32), "blockrnn", 0.002),
        _row("lstm_cell", (1, 32, 32), "tf", 0.02)]}
    wanted = (("all", "lstm_fwdbwd", shape, "tf", 0.2),
              ("all", "lstm_fwdbwd", shape, "torch", 0.67),
              ("all", "lstm_fwdbwd", shape, "sgemm", 0.75),
              ("all", "lstm_fwd", shape, "ort", 1.5),
              ("all", "lstm_cell", (1, 32, 32), "tf", 0.05),
              ("one", "lstm_fwdbwd", shape, "torch", 0.85),
              ("scaling", "lstm_fwdbwd", shape, "scaling", 1.8),
              ("scaling", "lstm_fwd", shape, "scaling", 1.8))
    v = targets.evaluate(results, wanted)
    assert [x["met"] for x in v] == [False, True, False, None, False, False, False, None,
                                     False, True]
    assert math.isclose(v[0]["value"], 60 / 250) and math.isclose(v[1]["value"], 60 / 90)
    assert math.isclose(v[0]["floor"], flops / 200e9 / 0.250)
    assert v[2]["value"] == 0.74 and v[2]["floor"] is None
    assert v[3]["value"] is None and v[4]["floor"] is None and math.isclose(v[4]["value"], 0.1)
    assert math.isclose(v[5]["value"], 100 / 110)
    assert math.isclose(v[5]["floor"], flops / 100e9 / 0.110)     # the one-core peak
    assert math.isclose(v[6]["value"], 100 / 60)
    # spread: all cores 60 / 50 = 1.2 (the worst row), one core 100 / 95
    assert v[8]["peer"] == "spread" and v[8]["mode"] == "all"
    assert math.isclose(v[8]["value"], 1.2) and v[8]["over"] == 1 and v[8]["rows"] == 2
    assert math.isclose(v[9]["value"], 100 / 95)
    assert (v[8]["peer_rows"], v[8]["peer_over"]) == (3, 1)      # TensorFlow's 250 / 200
    assert math.isclose(v[8]["peer_worst"], 1.25)
    assert (v[9]["peer_rows"], v[9]["peer_over"], v[9]["peer_worst"]) == (1, 0, 1.0)
    text = targets.format_verdicts(v)
    assert "all cores, LSTM fwd+bwd 100,32,256,256: blockrnn / TensorFlow <= 0.2" in text
    assert "0.240  MISSED  (roofline floor" in text and "0.667  met" in text
    assert "sgemm share >= 75%" in text and "74.0%  MISSED" in text
    assert "one core -> all cores, LSTM fwd+bwd 100,32,256,256: blockrnn one core / all " \
           "cores >= 1.8x" in text and "1.67x  MISSED" in text
    assert "1.200x  MISSED  (worst: LSTM fwd+bwd 100,32,256,256; 1 rows over; peers: " \
           "1 of 3 rows over, worst 1.250x)" in text
    assert "not measured" in text and "2 of 8 measured targets met" in text

    results["header"]["usable_cpus"] = 1       # one CPU: no scaling to judge
    v = targets.evaluate(results, wanted)
    assert v[6]["met"] is None and "n/a (1 usable CPU)" in targets.format_verdicts(v)
    assert targets.evaluate(results, wanted, spread_bound=1.25)[8]["met"] is True

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
    assert all(t[3] in ("sgemm", "scaling") or t[3] in peers.IMPLS for t in targets.TARGETS)


def test_scaling_table_from_the_rows():
    shape = (100, 32, 256, 256)
    results = {"header": {"usable_cpus": 2}, "rows": [
        dict(_row("lstm_fwd", shape, "blockrnn", 30.0), workload_title="LSTM fwd",
             impl_title="blockrnn"),
        dict(_row("lstm_fwd", shape, "blockrnn", 57.0, mode="one"), workload_title="LSTM fwd",
             impl_title="blockrnn"),
        dict(_row("lstm_fwd", shape, "ort", 20.0), workload_title="LSTM fwd",
             impl_title="ONNX Runtime")]}
    rows = run.scaling_rows(results)
    assert len(rows) == 1 and math.isclose(rows[0]["scaling"], 1.9)
    assert "1.90x" in run.format_scaling(results)
    results["header"]["usable_cpus"] = 1
    assert "n/a (1 core)" in run.format_scaling(results)


def test_the_targets_table():
    """The performance targets of issue 25 (ratios of medians: blockrnn / peer); the
    forwards against ONNX Runtime on the inference forward (the function ORT computes)."""
    got = {(m, w, s, p): b for m, w, s, p, b in targets.TARGETS}
    assert len(got) == len(targets.TARGETS) == 27
    big, mid, long_, one = (100, 64, 512, 512), (100, 32, 256, 256), (200, 16, 128, 256), \
        (50, 1, 128, 128)
    for s in (mid, long_, big):
        assert got[("all", "lstm_infer", s, "ort")] == 0.95
        assert got[("all", "gru_infer", s, "ort")] == 0.8
        assert got[("all", "lstm_fwdbwd", s, "torch")] == 0.9
        assert got[("all", "gru_fwdbwd", s, "torch")] == 0.6
    assert got[("all", "lstm_infer", one, "ort")] == got[("all", "gru_infer", one, "ort")] == 0.6
    assert got[("all", "lstm_fwdbwd", one, "torch")] == 0.5
    for s in (mid, big):
        assert got[("one", "lstm_infer", s, "ort")] == 0.9
        assert got[("one", "lstm_fwdbwd", s, "torch")] == 0.85
        assert got[("one", "gru_fwdbwd", s, "torch")] == 0.6
    for w in ("lstm_fwd", "lstm_fwdbwd", "gru_fwd", "gru_fwdbwd"):
        assert got[("scaling", w, mid, "scaling")] == 1.8
    assert got[("scaling", "lstm_fwdbwd", big, "scaling")] == 1.8
    assert got[("all", "lstm_fwdbwd", big, "sgemm")] == 0.85
    assert targets.SPREAD_BOUND == 1.10
    assert set(targets.THREAD_TARGETS) == {(one, "default", 1.8), (mid, "default", 0.95),
                                           (mid, 1, 1.8)}


def test_stacked_and_model_rows_default_shape_and_flops(tmp_path, capsys, monkeypatch):
    """The 2-layer bidirectional rows (blockrnn.torch.LSTM vs nn.LSTM) and the model rows
    run at STACKED_SHAPES / MODEL_SHAPES only unless --shapes is given; the stacked flops
    sum both layers (layer 1 reads 2H) and both directions, the model's add the head's."""
    assert peers.flops("lstm2bi_fwd", 100, 32, 256, 256) == \
        2 * 2.0 * 100 * 32 * 4 * 256 * ((256 + 256) + (512 + 256))
    assert peers.flops("lstm2bi_fwdbwd", 5, 2, 4, 6) == 3 * peers.flops("lstm2bi_fwd", 5, 2,
                                                                       4, 6)
    assert peers.flops("lstm_model", 5, 2, 4, 6) == \
        3 * (peers.flops("lstm_fwd", 5, 2, 4, 6) + 2.0 * 5 * 2 * 6 * peers.MODEL_VOCAB)
    monkeypatch.setattr(run, "DEFAULT_SHAPES", ((5, 2, 4, 6), (4, 3, 4, 6)))
    monkeypatch.setattr(run, "STACKED_SHAPES", ((4, 3, 4, 6),))
    monkeypatch.setattr(run, "MODEL_SHAPES", ((5, 2, 4, 6),))
    path = tmp_path / "bench.json"
    assert run.main(["--quick", "--rounds", "1", "--sgemm-size", "64", "--settle", "0",
                     "--cores", "one", "--workloads", "lstm_fwd", "lstm2bi_fwd",
                     "lstm2bi_fwdbwd", "lstm_model", "--only", "blockrnn,pytorch",
                     "--json", str(path)]) == 0
    results = json.loads(path.read_text())
    got = {(r["workload"], tuple(r["shape"]), r["impl"], r["mode"]) for r in results["rows"]}
    assert got == {(w, s, i, "one") for i in ("blockrnn", "torch") for w, s in (
        ("lstm_fwd", (5, 2, 4, 6)), ("lstm_fwd", (4, 3, 4, 6)),
        ("lstm2bi_fwd", (4, 3, 4, 6)), ("lstm2bi_fwdbwd", (4, 3, 4, 6)),
        ("lstm_model", (5, 2, 4, 6)))}
    checked = {(p["workload"], p["impl"]) for p in results["parity"] if p["ok"]}
    assert {("lstm2bi_fwd", "torch"), ("lstm2bi_fwdbwd", "torch"),
            ("lstm_model", "torch")} <= checked
    out = capsys.readouterr().out
    assert "LSTM 2-layer bidi fwd+bwd" in out and "scaling, one core" not in out
    assert "one core  5,2,4,6" in out and "ms/step" in out


def test_serve_mode_rows_verdicts_and_one_process_per_implementation(tmp_path, capsys):
    """bench --serve at a tiny size: every implementation and setting has a row per
    (cell, H, B, callers), the verdict table has one line per row key, and each
    implementation ran in a process of its own (not this one)."""
    path = tmp_path / "serve.json"
    status = run.main(["--serve", "--serve-hidden", "16", "--serve-steps", "4",
                       "--serve-batches", "1", "--serve-callers", "1", "2",
                       "--serve-duration", "0.1", "--serve-warmup", "0.02",
                       "--serve-rounds", "1", "--sgemm-size", "256", "--json", str(path)])
    out = capsys.readouterr().out
    assert status == 0
    assert "req/s" in out and "p99 ms" in out and "best/ORT" in out and "ceiling" in out
    assert "WARNING" not in out                      # every answer agrees with blockrnn's
    results = json.loads(path.read_text())
    rows = results["rows"]
    keys = {(r["cell"], r["H"], r["B"], r["callers"]) for r in rows}
    assert keys == {(c, 16, 1, n) for c in ("gru", "lstm") for n in (1, 2)}
    for key in keys:
        settings = {(r["impl"], r["setting"]) for r in rows
                    if (r["cell"], r["H"], r["B"], r["callers"]) == key}
        assert settings == {(i, s) for i, pair in serve.SETTINGS.items() for s in pair}
    assert all(r["rps"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"] for r in rows)
    assert len(results["checks"]) == len(keys)
    for c in results["checks"]:
        line = [ln for ln in out.splitlines()
                if ln.split()[:4] == [c["cell"], "16", "1", str(c["callers"])]
                and ln.rstrip().endswith(("met", "NOT met"))]
        assert len(line) == 1 and f"{c['ratio']:.2f}x" in line[0]
        # the ceiling: the sgemm roofline's requests/s over ORT's best
        ort_best = max(r["rps"] for r in rows if r["impl"] == "ort" and (
            r["cell"], r["H"], r["B"], r["callers"]) == (c["cell"], 16, 1, c["callers"]))
        peak = max(results["sgemm"]["gflops"])
        assert results["sgemm"]["n"] == 256 and peak > 0
        flops = 2 * 4 * 1 * (16 + 16) * (4 if c["cell"] == "lstm" else 3) * 16
        assert c["ceiling"] == pytest.approx(peak * 1e9 / flops / ort_best, rel=1e-12)
        assert f"{c['ceiling']:.2f}x" in line[0]
    assert f"{sum(c['met'] for c in results['checks'])} of {len(keys)} rows met" in out
    pids = [w["pid"] for w in results["workers"]]
    assert sorted(w["impl"] for w in results["workers"]) == ["blockrnn", "ort", "torch"]
    assert len(set(pids)) == 3 and os.getpid() not in pids

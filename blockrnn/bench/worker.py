"""One fresh process of ``python -m blockrnn bench``: times ONE implementation.

    python -m blockrnn.bench.worker --spec JSON --out FILE

``blockrnn.bench.run`` starts one of these per implementation per round (and one per
sgemm roofline measurement), so that no implementation runs after, or next to, another
library's thread pools. The worker imports only the implementation it times (NumPy and
the ``blockrnn`` package come with ``-m``; a peer's worker imports its peer first, see
PEER_MODULES, and never calls a blockrnn op).

The spec (a JSON object)::

    impl       "blockrnn", "tf", "torch", "ort", "jax", or "sgemm"
    tasks      [{"workload": ..., "shape": [T, B, I, H] or [B, I, H] (cells) or [n] (sgemm)}]
    seed       inputs' seed (the parent checked parity on the same inputs)
    reps       at most this many timed samples per task ...
    budget_s   ... and no more once they last this long (at least one)
    sample_target_s   a sample is the mean of enough calls to last this long (one call
               when a call is longer)
    one_core   pin every thread of this process to CPU ``cpu`` and set every runtime to 1
               thread (the parent sets OMP_NUM_THREADS, XLA_FLAGS, ... in our environment)
    num_threads     all cores: None for each runtime's defaults, else that many threads
               (torch, TF, ORT as Peers sets them; BLAS and OpenMP by threadpoolctl)
    memory     also measure the peak memory of one more call per task
    settle_s   pause before each task (the previous task's spinning threads go idle)
    warmup_s, warmup_max_s   each task's warm-up (``warm_up``)
    jax_cache_dir   JAX's persistent compilation cache (the parent gives one per mode):
               later rounds load the executables instead of compiling them again (the
               same code; compilation is not timed, it only lengthens the run)

Each task is built (``blockrnn.bench.peers.build``), warmed up (``warm_up``), then timed.
The output file holds one JSON object: the pid, the CPU affinity, the runtimes' thread
settings, which peer libraries are imported, and per task the per-call seconds of each
timed sample (``times_s``), the process CPU seconds of each (``cpu_s``), the warm-up
calls (``warmup_calls``), the number of threads of the process after the calls
(/proc/self/status Threads), the calls per sample, the memory numbers, or the error
that stopped it.
"""
import argparse
import json
import os
import resource
import sys
import time

# The libraries a worker may import; the output says which ones it did.
LIBRARIES = ("tensorflow", "torch", "onnxruntime", "jax")


def pin_process(cpu):
    """Pin every existing thread of this process to ``cpu`` (threads started later
    inherit the creating thread's affinity)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
        except OSError:    # the thread ended meanwhile
            pass


def process_threads():
    """The number of threads of this process (/proc/self/status Threads), or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def minor_faults():
    """The minor page faults this process has taken so far (getrusage)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# warm_up's steady state: this many calls in a row whose minor page faults agree to
# within STEADY_FAULTS_REL of their largest count. Memory an implementation maps afresh
# at every call is part of what it costs: blockrnn's outputs above 4 MB (fresh, pre-
# faulted blocks; 938 faults a call, every call, for block_lstm_v2 + grad at
# 100,64,512,512) and PyTorch's LSTM fwd+bwd (~8130 +- 30 a call at 100,32,256,256).
STEADY_CALLS = 3
STEADY_FAULTS_REL = 0.02


def warm_up(fn, seconds, max_seconds=None, faults=minor_faults):
    """Call fn until `seconds` have passed, at least once: thread pools, JIT compilation,
    first-touch memory, and the cores the call runs on awake (blockrnn.bench.run.WARMUP_S).
    With `max_seconds`, go on while less than that has passed in all, until the process's
    heap has settled (WARMUP_MAX_S): a call after the first took no new minor page fault,
    or the last STEADY_CALLS calls took the same number to within STEADY_FAULTS_REL. Every
    call counts, those of the first `seconds` too, but the first never settles it alone
    (it is a workload's first in its process: its arrays, code and caches are new).
    `faults()` reads the process's fault count (minor_faults; the tests give their own).
    Returns the number of calls."""
    start = time.perf_counter()
    counts = []                        # new minor faults of each call
    while True:
        before = faults()
        fn()
        counts.append(faults() - before)
        elapsed = time.perf_counter() - start
        if elapsed < seconds:
            continue
        if max_seconds is None or elapsed >= max_seconds:
            return len(counts)
        if counts[-1] == 0 and len(counts) > 1:
            return len(counts)
        last = counts[-STEADY_CALLS:]
        if len(last) == STEADY_CALLS and max(last) - min(last) <= STEADY_FAULTS_REL * max(last):
            return len(counts)


def time_task(fn, reps, budget, calls=1):
    """Up to ``reps`` samples of ``calls`` calls each, stopping once the samples last
    ``budget`` seconds (at least one). Returns (per-call wall seconds, per-call process
    CPU seconds), one of each per sample."""
    walls, cpus = [], []
    start = time.perf_counter()
    while len(walls) < reps and (not walls or time.perf_counter() - start < budget):
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(calls):
            fn()
        w1, c1 = time.perf_counter(), time.process_time()
        walls.append((w1 - w0) / calls)
        cpus.append((c1 - c0) / calls)
    return walls, cpus


def _sgemm(n):
    from scipy.linalg.blas import sgemm
    import numpy as np
    rng = np.random.default_rng(0)
    a = np.asfortranarray(rng.standard_normal((n, n), dtype=np.float32))
    b = np.asfortranarray(rng.standard_normal((n, n), dtype=np.float32))
    return lambda: sgemm(1.0, a, b)


def run_spec(spec):
    """The worker's job; returns the output dict."""
    if spec.get("one_core"):
        pin_process(spec["cpu"])
    from blockrnn.bench import measure, peers   # noqa: E402  (after the pinning)

    impl = spec["impl"]
    out = {"pid": os.getpid(), "impl": impl, "one_core": bool(spec.get("one_core")),
           "affinity": sorted(os.sched_getaffinity(0)), "messages": [], "results": []}
    limit = None
    if spec.get("num_threads") and not spec.get("one_core"):
        try:
            from threadpoolctl import threadpool_limits
            # BLAS and OpenMP (blockrnn's threads; torch's too, when it shares libgomp)
            limit = threadpool_limits(limits=spec["num_threads"])
        except ImportError:
            out["messages"].append("threadpoolctl not installed: BLAS and OpenMP threads "
                                   "not limited")
    workloads = {t["workload"] for t in spec["tasks"]}
    wanted = (impl,)
    if impl == "blockrnn" and workloads & {*peers.STACKED_WORKLOADS, *peers.MODEL_WORKLOADS}:
        wanted = ("blockrnn", "torch")   # blockrnn.torch runs in torch: set its threads
    found = peers.Peers(wanted, threads=spec.get("num_threads"),
                        one_core=bool(spec.get("one_core"))) if impl != "sgemm" else None
    if found is not None and found.jax is not None and spec.get("jax_cache_dir"):
        found.jax.config.update("jax_compilation_cache_dir", spec["jax_cache_dir"])
        found.jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    if found is not None:
        out["messages"] += found.skipped + found.notes
        out["thread_settings"] = found.thread_settings()
    for task in spec["tasks"]:
        workload, shape = task["workload"], tuple(task["shape"])
        result = {"workload": workload, "shape": list(shape), "error": None}
        out["results"].append(result)
        try:
            if spec.get("settle_s"):
                time.sleep(spec["settle_s"])
            if impl == "sgemm":
                fn = _sgemm(shape[0])
            else:
                if workload in peers.CELL_WORKLOADS:
                    problem = peers.CellProblem(*shape, seed=spec.get("seed", 0))
                else:
                    problem = peers.Problem(*shape, seed=spec.get("seed", 0))
                impls, messages = peers.build(workload, problem, found, (impl,))
                if not impls:
                    raise RuntimeError("; ".join(messages) or "no such implementation")
                fn = impls[0].run
            result["warmup_calls"] = warm_up(fn, spec.get("warmup_s", 0.0),
                                             spec.get("warmup_max_s"))
            # A sample of ~20 ms, not one call: a sub-millisecond call timed alone
            # varies with its timer and its wake-ups (batch-1 rows: 21-48% median over
            # best across rounds, against 2-9% with loops), and the process CPU time
            # of a partner thread still running on another CPU is not counted yet
            # (CPU/wall read 1.01 for 2-thread calls).
            calls = measure.calibrate(fn, spec.get("sample_target_s", 0.02))
            result["times_s"], result["cpu_s"] = time_task(
                fn, spec.get("reps", 5), spec.get("budget_s", 0.25), calls)
            result["calls_per_sample"] = calls
            result["threads"] = process_threads()
            if spec.get("memory") and impl != "sgemm":
                result["rss_peak_bytes"] = measure.rss_peak_increase(fn)
                result["tracemalloc_peak_bytes"] = (measure.tracemalloc_peak(fn)
                                                    if impl == "blockrnn" else None)
        except Exception as exc:  # noqa: BLE001 - reported by the parent
            result["error"] = f"{type(exc).__name__}: {exc}"
    out["threadpools"] = measure.threadpool_info()
    for pool in out["threadpools"] or []:   # blockrnn's OpenMP, the BLAS libraries
        name = os.path.basename(pool["filepath"] or "") or pool["internal_api"]
        out.setdefault("thread_settings", {})[f"{pool['internal_api']} {name}"] = \
            pool["num_threads"]
    out["modules"] = {name: name in sys.modules for name in LIBRARIES}
    if limit is not None:
        limit.restore_original_limits()
    return out


# --------------------------------------------------------------------------
# The parent's side: start a worker and read its result
# --------------------------------------------------------------------------

# One core: every runtime told to use one thread before it starts (TF's and torch's
# pools and ORT's are set by Peers(one_core=True) in the worker).
ONE_CORE_ENV = {
    "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
    "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
}


def child_env(one_core):
    """The worker's environment: ours, with ONE_CORE_ENV for one core (XLA_FLAGS
    appended to any the user set), and this blockrnn first on PYTHONPATH."""
    import blockrnn
    env = dict(os.environ)
    if one_core:
        for key, value in ONE_CORE_ENV.items():
            env[key] = (f"{env[key]} {value}" if key == "XLA_FLAGS" and env.get(key)
                        else value)
    root = os.path.dirname(os.path.dirname(os.path.abspath(blockrnn.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "")
                                                  .split(os.pathsep) if p])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def one_core_cpu():
    """The CPU one-core workers are pinned to: the last usable one."""
    return max(os.sched_getaffinity(0))


# A peer's runtime is loaded before blockrnn, as in a process that holds only that peer:
# the first module to load GNU OpenMP sets its wait policy for the whole process
# (blockrnn's import sets a short spin, blockrnn/__init__.py), and PyTorch's pool would
# otherwise run on blockrnn's choice (PASSIVE, until 2026-11-26: torch's LSTM fwd+bwd at
# 100,32,256,256 measured 52.4 ms under it, 33.9 under the spin).
PEER_MODULES = {"torch": "torch", "tf": "tensorflow", "ort": "onnxruntime", "jax": "jax"}
_BOOTSTRAP = ("import importlib, runpy, sys\n"
              "peer, module = sys.argv.pop(1), sys.argv.pop(1)\n"
              "try:\n    importlib.import_module(peer)\n"
              "except Exception:\n    pass   # the worker reports it as not importable\n"
              "runpy.run_module(module, run_name='__main__', alter_sys=True)")


def peer_first_command(module, impl, args):
    """``python -m module args``, or for a peer (PEER_MODULES) the same after importing
    that peer: the command line of a bench worker (this module, blockrnn.bench.serve)."""
    peer = PEER_MODULES.get(impl)
    if peer is None:
        return [sys.executable, "-m", module, *args]
    return [sys.executable, "-c", _BOOTSTRAP, peer, module, *args]


def launch(spec, timeout=1800):
    """Run one worker on ``spec`` (one_core: pinned, ONE_CORE_ENV); returns its output
    dict, or raises RuntimeError with the end of its stderr."""
    import subprocess
    import tempfile
    spec = dict(spec)
    if spec.get("one_core") and spec.get("cpu") is None:
        spec["cpu"] = one_core_cpu()
    with tempfile.TemporaryDirectory(prefix="blockrnn-bench-") as tmp:
        path = os.path.join(tmp, "out.json")
        proc = subprocess.run(
            peer_first_command("blockrnn.bench.worker", spec["impl"],
                               ["--spec", json.dumps(spec), "--out", path]),
            env=child_env(spec.get("one_core")),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
        if proc.returncode != 0 or not os.path.exists(path):
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
            raise RuntimeError(f"worker for {spec['impl']} exited with status "
                               f"{proc.returncode}: {tail}")
        with open(path) as f:
            return json.load(f)


def sgemm_roofline(spec, n):
    """SciPy's sgemm n^3 float32 in a worker of its own on ``spec`` (its reps,
    one_core, num_threads, ...): {"n", "repeats", "best_s", "gflops"}, the best
    of its reps. Raises as ``launch`` does (or KeyError if the product failed)."""
    spec = dict(spec, impl="sgemm", tasks=[{"workload": "sgemm", "shape": [n]}],
                budget_s=float("inf"))
    best = min(launch(spec)["results"][0]["times_s"])
    return {"n": n, "repeats": spec["reps"], "best_s": best,
            "gflops": 2.0 * n ** 3 / best / 1e9}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m blockrnn.bench.worker",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--spec", required=True, help="the job, a JSON object")
    parser.add_argument("--out", required=True, help="where to write the JSON result")
    opts = parser.parse_args(argv)
    out = run_spec(json.loads(opts.spec))
    with open(opts.out, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""blockrnn vs its peers: ``python -m blockrnn bench`` (``blockrnn.bench.run.main``).

Usage::

    python -m blockrnn bench [--quick] [--rounds N] [--big-rounds N] [--reps N]
                             [--cores all|one|both]
                             [--shapes T,B,I,H ...] [--only blockrnn,torch,...]
                             [--workloads lstm_fwd lstm_fwdbwd gru_fwd gru_fwdbwd lstm2bi_fwd
                                          lstm2bi_fwdbwd lstm_model lstm_cell gru_cell]
                             [--impls blockrnn tf torch ort jax] [--num-threads N]
                             [--sgemm-size N] [--json FILE] [--plot FILE.png]
    python -m blockrnn bench --threads [--thread-counts 1,2,4] [--thread-shape 50,1,128,128 ...]
                             [--thread-duration S] [--blas-threads default,1] [--json FILE]

Entry point for ``python -m blockrnn bench``: ``main(argv) -> int`` (exit status 0, or 1
if a parity check or a blockrnn call failed, 2 on bad options such as --plot without
matplotlib).

What it measures (float32, see ``blockrnn.bench.peers`` for the exact calls):

* Per shape (T, B, I, H) -- by default (100,32,256,256), (100,64,512,512), (50,1,128,128),
  (200,16,128,256) -- LSTM forward, LSTM forward+backward, GRU forward and GRU
  forward+backward, for blockrnn, TensorFlow raw ops, PyTorch, ONNX Runtime and JAX (each
  only where it has the op; inference-only ORT has no backward).
* At (100,32,256,256) -- or at every ``--shapes`` shape when given --: a 2-layer
  bidirectional LSTM (``blockrnn.torch.LSTM`` against ``torch.nn.LSTM``, forward and
  forward+backward), and one training step of a small PyTorch model, Embedding(1000, I)
  -> LSTM(I, H) -> Linear(H, 1000) -> cross-entropy, backward, SGD step, with
  ``blockrnn.torch.LSTM.from_torch(nn_lstm)`` against the same model with the nn.LSTM.
* The batch-1 cell latency: LSTMBlockCell / GRUBlockCell at B=1, I=H=32.

Method:

1. Parity, in this process: every implementation of every workload is checked against
   blockrnn (or a NumPy reference) once; a failing one is reported loudly and not timed.
2. Timing, each implementation in its OWN fresh process (``blockrnn.bench.worker``, which
   imports only the implementation it times): rounds alternate the implementations --
   blockrnn, TensorFlow, PyTorch, ONNX Runtime, JAX, then again -- ``--rounds`` rounds
   (default 7, --quick 2; ``--big-rounds``, default 5, at the shapes with >= BIG_FLOPS
   LSTM forward flops, i.e. 100,64,512,512, so that a default run fits in ~16 minutes on
   2 cores). In a round, the worker of one implementation runs all its
   workloads: each is called for ``--warmup`` seconds to warm up (default WARMUP_S, at
   least once: a core that sat idle runs its first milliseconds slowly on a VM), and on
   until the heap has settled (a call after the first takes no new page fault, or three
   in a row take the same number: ``worker.warm_up``; at most WARMUP_MAX_S in all), then timed up to ``--reps`` times (default
   5) but no longer than REP_BUDGET_S (at least once); the round's value is the best of
   those. A sample is the mean of enough back-to-back calls to last ~20 ms (one call when
   a call takes longer). The table shows per implementation the MEDIAN over the rounds
   and the best, and their spread (median / best - 1). The worker also reports its
   process's CPU time per call (CPU/wall: how many cores were busy on average) and its
   number of threads after the calls (/proc/self/status Threads).
3. Twice: on all cores (every runtime at its defaults, or ``--num-threads``), then on one
   core (the worker pinned to one CPU with ``os.sched_setaffinity``, OMP_NUM_THREADS,
   OPENBLAS_NUM_THREADS, MKL_NUM_THREADS = 1 and XLA_FLAGS single-threaded in its
   environment, ``torch.set_num_threads(1)``/``set_num_interop_threads(1)``, ORT and TF
   intra/inter-op 1). ``--cores all`` or ``one`` runs one of them. Then a scaling table:
   each implementation's one-core median / its all-cores median.
4. Peak memory (all-cores run, first round): one more call per workload in its worker:
   the peak RSS increase (``measure.rss_peak_increase``) and, for blockrnn, the
   tracemalloc peak, with blockrnn's memory bound (outputs + one T x B x 4H workspace +
   B x H) next to it.

Columns: GFLOP/s = matmul flops / median time, flops = 2*T*B*(I+H)*4H for the LSTM forward
(3H for the GRU), x3 with the backward; ``blockrnn/peer`` = blockrnn's median time divided
by that peer's median time (below 1: blockrnn is faster); ``sgemm share`` = flops /
(median time x the peak sgemm GFLOP/s of that mode: scipy.linalg.blas.sgemm on 2048^3
float32 in its own worker, best of 3, at the start and at the end of the mode's rounds,
the better of the two).

After the tables, the targets are judged on this run (``blockrnn.bench.targets``; also
saved under "targets" by --json).

``--threads`` switches to the thread-scaling mode of ``blockrnn.bench.threads`` (1, 2, 4
Python threads each running ``block_lstm_v2`` inference on (50,1,128,128) and
(100,32,256,256), with SciPy's BLAS as configured and limited to 1 thread; aggregate
sequences/s, the speed-up relative to 1 thread and the 2-thread targets).
"""
import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np
import scipy

import blockrnn
from blockrnn.bench import measure, peers, serve, targets, threads, worker
from blockrnn.bench.peers import (CELL_SHAPE, CELL_WORKLOADS, DEFAULT_SHAPES, IMPL_TITLES, IMPLS,
                                  MODEL_SHAPES, MODEL_WORKLOADS, SEQUENCE_WORKLOADS,
                                  STACKED_SHAPES, STACKED_WORKLOADS, WORKLOAD_TITLES, WORKLOADS)

SAMPLE_TARGET_S = 0.02       # one timed sample (a loop of calls) lasts about this long
QUICK_SAMPLE_TARGET_S = 0.005
REP_BUDGET_S = 0.2           # a round's timed samples of one workload stop after this long
QUICK_REP_BUDGET_S = 0.05
# Pause in a worker before each workload: the previous workload's spinning threads (of
# the same library) go idle. Between implementations there is none to wait for: each
# one's process has ended.
SETTLE_S = 0.05
# Each workload's warm-up in a round: calls for at least this long (at least one).
# Threads and memory are set up by the first call, but a core that sat idle runs its
# first milliseconds of work slowly on a VM: on the 2-core Zen 5 KVM guest, a 2-thread
# batch-1 inference call after single-thread workloads took ~275 us for ~15 calls in a
# row, then ~65 (its one-thread time: ~78); ONNX Runtime's pool, which spins between
# calls, woke its cores in its own single warm-up call.
WARMUP_S = 0.02
# ... then more calls, until the heap has settled (worker.warm_up: a call after the first
# takes no new minor page fault, or three in a row take the same number), for at most this long
# in all (the quick run: QUICK_WARMUP_MAX_S). glibc serves a large allocation with a
# fresh mmap until freeing one has raised its mmap threshold, so the first calls of a
# process that returns large new arrays fault their pages in: block_lstm_v2 + its grad
# at 100,32,256,256 on the 2-core Zen 4 took ~30 + 45 ms with ~500 faults for 4 calls,
# then 18 + 40 ms with none. A training loop runs in that steady state; timing calls 2-5
# of each round measured whether the round had reached it (rounds of 55 or of 64 ms).
# The same rule for every implementation (each in its own process).
WARMUP_MAX_S = 1.0
QUICK_WARMUP_MAX_S = 0.25
# Shapes whose LSTM forward has at least this many matmul flops (100,64,512,512: 26.8e9)
# run --big-rounds rounds (default 5) instead of --rounds: they take most of the time of
# a default run, which fits in ~16 minutes on 2 cores that way (924-1012 s).
BIG_FLOPS = 1e10
BIG_ROUNDS = 5
MODES = ("all", "one")
MODE_TITLES = {"all": "all cores", "one": "one core"}
# --only accepts the names of IMPLS and these
IMPL_ALIASES = {"pytorch": "torch", "tensorflow": "tf", "onnxruntime": "ort",
                "onnx": "ort"}


def _only(text):
    names = [IMPL_ALIASES.get(n.strip().lower(), n.strip().lower())
             for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in IMPLS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown implementation(s) {bad}; choose from "
                                         f"{', '.join(IMPLS)} (or pytorch, tensorflow, "
                                         "onnxruntime)")
    return names


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m blockrnn bench",
        description="Time blockrnn against TensorFlow raw ops, PyTorch, ONNX Runtime and JAX "
                    "(whichever are installed), each in its own process, on all cores and on "
                    "one. See the module docstring of blockrnn.bench.run for the method.")
    parser.add_argument("--quick", action="store_true",
                        help="2 rounds of at most 2 calls, shorter cell samples, sgemm best "
                             "of 1 (CI smoke)")
    parser.add_argument("--rounds", "--repeats", dest="rounds", type=int, default=None,
                        help="fresh-process rounds per implementation (default 7, --quick 2)")
    parser.add_argument("--big-rounds", type=int, default=None,
                        help=f"rounds of the shapes with >= {BIG_FLOPS:.0e} LSTM forward flops "
                             f"(100,64,512,512) (default {BIG_ROUNDS}, at most --rounds)")
    parser.add_argument("--reps", type=int, default=None,
                        help="at most this many timed samples per workload in a round, the "
                             f"round keeping the best (default 5, --quick 2; they stop after "
                             f"{REP_BUDGET_S:g} s, at least one; a sample: the mean of the "
                             f"calls of ~{SAMPLE_TARGET_S * 1e3:g} ms, or one longer call)")
    parser.add_argument("--cores", choices=("all", "one", "both"), default="both",
                        help="run on all cores, on one core (pinned, every runtime 1 thread),"
                             " or both (default)")
    parser.add_argument("--shapes", nargs="+", type=threads.parse_shape, default=None,
                        metavar="T,B,I,H",
                        help="sequence shapes (default: "
                             + " ".join(",".join(map(str, s)) for s in DEFAULT_SHAPES) + ")")
    parser.add_argument("--cell-shape", type=lambda s: threads.parse_shape(s, 3),
                        default=CELL_SHAPE, metavar="B,I,H",
                        help="cell-latency shape (default 1,32,32)")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS),
                        help="implementations to run (default: all that are installed)")
    parser.add_argument("--only", type=_only, default=None, metavar="blockrnn,pytorch,...",
                        help="the same as --impls, comma-separated")
    parser.add_argument("--num-threads", type=int, default=None,
                        help="all-cores mode: threads for every library instead of each "
                             "one's defaults (BLAS and OpenMP -- blockrnn's threads -- too, "
                             "with threadpoolctl)")
    parser.add_argument("--settle", type=float, default=SETTLE_S, metavar="S",
                        help="pause in a worker before each workload, so that the previous "
                             "workload's spinning threads are idle (default %(default)s s)")
    parser.add_argument("--warmup", type=float, default=WARMUP_S, metavar="S",
                        help="warm-up of each workload in a round: calls for at least S "
                             "seconds, at least one (default %(default)s s)")
    parser.add_argument("--sgemm-size", type=int, default=2048,
                        help="n of the n x n x n sgemm roofline (default 2048)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="save the raw results as JSON")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="save grouped bars of GFLOP/s (needs matplotlib)")
    parser.add_argument("--threads", action="store_true",
                        help="thread-scaling mode instead of the table (blockrnn.bench.threads)")
    threads.add_arguments(parser, prefix="thread-")
    threads.add_blas_argument(parser)
    serve.add_arguments(parser)
    opts = parser.parse_args(argv)
    if opts.only:
        opts.impls = [i for i in IMPLS if i in opts.only]
    return opts


def modes_of(opts):
    return MODES if opts.cores == "both" else (opts.cores,)


# --------------------------------------------------------------------------
# Header
# --------------------------------------------------------------------------

def header(found, opts):
    """Environment facts as a dict (also printed)."""
    info = {
        "blockrnn": blockrnn.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        **{k: (v or "not installed") for k, v in found.versions().items()},
        "cpu": measure.cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": measure.usable_cpus(),
        "one_core_cpu": worker.one_core_cpu(),
        "env": {k: os.environ.get(k) for k in measure.THREAD_ENV},
        "num_threads": opts.num_threads,
        "modes": list(modes_of(opts)),
    }
    config = io.StringIO()
    if hasattr(blockrnn, "show_config"):
        with contextlib.redirect_stdout(config):
            blockrnn.show_config()
    info["show_config"] = config.getvalue()
    print(f"blockrnn {info['blockrnn']} benchmark -- {time.strftime('%Y-%m-%d %H:%M:%S')}")
    if info["show_config"]:
        print("blockrnn.show_config():")
        print(info["show_config"].rstrip("\n"))
    print("versions: " + ", ".join(f"{k} {info[k]}" for k in (
        "python", "numpy", "scipy", "tensorflow", "torch", "onnxruntime", "onnx", "jax")))
    print(f"CPU: {info['cpu']}; os.cpu_count() = {info['cpu_count']}, usable CPUs = "
          f"{info['usable_cpus']}")
    print("environment: " + ", ".join(f"{k}={v}" for k, v in info["env"].items()))
    print("all cores: " + (f"every library {opts.num_threads} threads (--num-threads)"
                           if opts.num_threads else "each runtime's default threads"))
    print(f"one core: workers pinned to CPU {info['one_core_cpu']}, "
          + ", ".join(f"{k}={v}" for k, v in worker.ONE_CORE_ENV.items())
          + ", torch/TF/ORT intra- and inter-op threads 1")
    return info


# --------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------

def _shape_label(workload, shape):
    if workload in CELL_WORKLOADS:
        B, I, H = shape
        return f"B,I,H={B},{I},{H}"
    return ",".join(map(str, shape))


def plan(opts):
    """The (workload, shape) pairs of this run, in table order."""
    out = []
    for shape in (opts.shapes or DEFAULT_SHAPES):
        for workload in SEQUENCE_WORKLOADS:
            own_shapes = (STACKED_SHAPES if workload in STACKED_WORKLOADS
                          else MODEL_SHAPES if workload in MODEL_WORKLOADS else None)
            default_only = (own_shapes is not None and opts.shapes is None
                            and tuple(shape) not in own_shapes)
            if workload in opts.workloads and not default_only:
                out.append((workload, tuple(shape)))
    for workload in CELL_WORKLOADS:
        if workload in opts.workloads:
            out.append((workload, tuple(opts.cell_shape)))
    return out


class Run:
    def __init__(self, opts, found):
        self.opts, self.found = opts, found
        self.rows, self.parity, self.messages = [], [], []
        self.failed = False
        self.rounds = opts.rounds or (2 if opts.quick else 7)
        self.big_rounds = min(self.rounds, opts.big_rounds or BIG_ROUNDS)
        self.reps = opts.reps or (2 if opts.quick else 5)
        self.budget = QUICK_REP_BUDGET_S if opts.quick else REP_BUDGET_S
        self.warmup_max = max(opts.warmup, QUICK_WARMUP_MAX_S if opts.quick else WARMUP_MAX_S)
        self.sample_target = QUICK_SAMPLE_TARGET_S if opts.quick else SAMPLE_TARGET_S
        self.sgemm_reps = 1 if opts.quick else 3
        self.tasks = {}          # impl -> [(workload, shape)] that passed parity
        self.calls = {}          # (workload, shape, impl) -> Impl label, note
        self.workers = []        # (mode, round, impl, pid, affinity, thread_settings, ...)
        self.roofline = {}
        self.round_seconds = []
        self.cache_dir = None    # JAX's compilation cache of the run (see worker)

    def say(self, text, loud=False):
        if loud:
            text = f"!!! {text} !!!"
        print(text)
        self.messages.append(text)

    # -- 1. parity, in this process --

    def check(self, workload, shape):
        title = f"{WORKLOAD_TITLES[workload]} [{_shape_label(workload, shape)}]"
        if workload in CELL_WORKLOADS:
            problem = peers.CellProblem(*shape, seed=self.opts.seed)
        else:
            problem = peers.Problem(*shape, seed=self.opts.seed)
        impls, messages = peers.build(workload, problem, self.found, self.opts.impls)
        for m in messages:
            self.say(f"  {title}: {m}")
        for impl in impls:
            if impl.check is not None:
                try:
                    result = impl.check()
                except Exception as exc:  # noqa: BLE001
                    self.say(f"{title}: {IMPL_TITLES[impl.impl]} parity check raised "
                             f"{type(exc).__name__}: {exc}; row excluded", loud=True)
                    self.failed = True
                    continue
                self.parity.append({"workload": workload, "shape": list(shape),
                                    "impl": impl.impl, "ok": result.ok, "text": result.text})
                if not result.ok:
                    self.say(f"PARITY FAILURE {title} {IMPL_TITLES[impl.impl]}: "
                             f"{result.text}; row excluded", loud=True)
                    self.failed = True
                    continue
                print(f"  parity {title} {IMPL_TITLES[impl.impl]}: {result.text}")
            self.tasks.setdefault(impl.impl, []).append((workload, shape))
            self.calls[(workload, shape, impl.impl)] = (impl.label, impl.note)

    # -- 2. timing, one fresh process per implementation per round --

    def rounds_of(self, workload, shape):
        """Rounds of a (workload, shape): --big-rounds for the big shapes."""
        big = (workload not in CELL_WORKLOADS
               and peers.flops("lstm_fwd", *shape) >= BIG_FLOPS)
        return self.big_rounds if big else self.rounds

    def spec(self, impl, mode, tasks, memory):
        return {"impl": impl, "tasks": [{"workload": w, "shape": list(s)} for w, s in tasks],
                "seed": self.opts.seed, "reps": self.reps, "budget_s": self.budget,
                "sample_target_s": self.sample_target, "one_core": mode == "one",
                "num_threads": self.opts.num_threads if mode == "all" else None,
                "memory": memory, "settle_s": self.opts.settle,
                "warmup_s": self.opts.warmup, "warmup_max_s": self.warmup_max,
                "jax_cache_dir": os.path.join(self.cache_dir, mode) if self.cache_dir
                else None}

    def sgemm(self, mode):
        spec = dict(self.spec("sgemm", mode, [], False), reps=self.sgemm_reps)
        try:
            return worker.sgemm_roofline(spec, self.opts.sgemm_size)
        except Exception as exc:  # noqa: BLE001
            self.say(f"sgemm roofline ({MODE_TITLES[mode]}) failed: {exc}", loud=True)
            return None

    def time_mode(self, mode, memory):
        """All rounds of one mode; returns {(workload, shape, impl): per-round dicts}."""
        start = self.sgemm(mode)
        if start:
            print(f"sgemm roofline ({MODE_TITLES[mode]}): scipy.linalg.blas.sgemm "
                  f"{start['n']}^3 float32, own process, best of {start['repeats']}: "
                  f"{start['gflops']:.1f} GFLOP/s")
        samples = {}
        order = [i for i in IMPLS if i in self.tasks]
        for r in range(self.rounds):
            began = time.perf_counter()
            for impl in order:
                tasks = [t for t in self.tasks[impl] if r < self.rounds_of(*t)]
                if not tasks:
                    continue
                spec = self.spec(impl, mode, tasks, memory and r == 0)
                launched = time.perf_counter()
                try:
                    out = worker.launch(spec)
                except Exception as exc:  # noqa: BLE001
                    self._failed(f"{MODE_TITLES[mode]}, round {r + 1}", impl, exc)
                    continue
                self.workers.append({
                    "mode": mode, "round": r, "impl": impl, "pid": out["pid"],
                    "seconds": time.perf_counter() - launched,
                    "affinity": out["affinity"], "modules": out["modules"],
                    "thread_settings": out.get("thread_settings"),
                    "threadpools": out.get("threadpools")})
                if r == 0:
                    for m in out["messages"]:
                        self.say(f"  {MODE_TITLES[mode]} {IMPL_TITLES[impl]}: {m}")
                    print(f"  {MODE_TITLES[mode]}, {IMPL_TITLES[impl]} worker (pid "
                          f"{out['pid']}, CPUs {out['affinity']}) threads: " + ", ".join(
                              f"{k} = {v}" for k, v in (out.get("thread_settings")
                                                        or {}).items()))
                for res in out["results"]:
                    key = (res["workload"], tuple(res["shape"]), impl)
                    if res["error"]:
                        title = (f"{WORKLOAD_TITLES[res['workload']]} "
                                 f"[{_shape_label(res['workload'], key[1])}]")
                        self._failed(f"{title}, {MODE_TITLES[mode]}, round {r + 1}", impl,
                                     res["error"])
                        continue
                    samples.setdefault(key, []).append(dict(res, pid=out["pid"]))
            self.round_seconds.append({"mode": mode, "round": r,
                                       "seconds": time.perf_counter() - began})
            print(f"  {MODE_TITLES[mode]}: round {r + 1} of {self.rounds} done "
                  f"({time.perf_counter() - began:.1f} s)")
        end = self.sgemm(mode)
        if end:
            print(f"sgemm roofline at the end ({MODE_TITLES[mode]}): {end['gflops']:.1f} "
                  "GFLOP/s")
        best = max((x for x in (start, end) if x), key=lambda x: x["gflops"], default=None)
        self.roofline[mode] = best or {"n": self.opts.sgemm_size, "gflops": float("nan")}
        return samples

    def _failed(self, where, impl, exc):
        loud = impl == "blockrnn"
        self.failed |= loud
        self.say(f"{where}: {IMPL_TITLES[impl]} failed ({exc}); sample skipped", loud=loud)

    # -- rows --

    def add_rows(self, mode, samples):
        peak = self.roofline[mode]["gflops"]
        order = [(w, s) for w, s in plan(self.opts)]
        for workload, shape in order:
            T, B, I, H = (1, *shape) if workload in CELL_WORKLOADS else shape
            flops = peers.flops(workload, T, B, I, H)
            base = None
            for name in IMPLS:
                rounds = samples.get((workload, shape, name))
                if not rounds:
                    continue
                per_round = [min(r["times_s"]) for r in rounds]
                median, best = statistics.median(per_round), min(per_round)
                # CPU/wall of each round's best sample: cores busy on average
                cpu_wall = statistics.median(
                    r["cpu_s"][r["times_s"].index(min(r["times_s"]))] / min(r["times_s"])
                    for r in rounds)
                if name == "blockrnn":
                    base = median
                first = rounds[0]
                label, note = self.calls[(workload, shape, name)]
                row = {
                    "mode": mode, "workload": workload,
                    "workload_title": WORKLOAD_TITLES[workload], "shape": list(shape),
                    "shape_label": _shape_label(workload, shape), "impl": name,
                    "impl_title": IMPL_TITLES[name], "call": label, "note": note,
                    "median_ms": 1e3 * median, "best_ms": 1e3 * best,
                    "spread": median / best - 1.0,
                    "rounds_ms": [1e3 * t for t in per_round],
                    "reps_per_round": [len(r["times_s"]) for r in rounds],
                    "warmup_calls": [r.get("warmup_calls") for r in rounds],
                    "calls_per_sample": first.get("calls_per_sample", 1),
                    "cpu_per_wall": cpu_wall,
                    "threads": max(r.get("threads") or 0 for r in rounds) or None,
                    "pids": [r["pid"] for r in rounds],
                    "flops": flops, "gflops": flops / median / 1e9,
                    "ratio_blockrnn_over_peer": (base / median if base is not None
                                                 and name != "blockrnn" else None),
                    "sgemm_share": flops / median / 1e9 / peak,
                    "rss_peak_bytes": first.get("rss_peak_bytes"),
                    "tracemalloc_peak_bytes": first.get("tracemalloc_peak_bytes"),
                    "memory_bound_bytes": (peers.memory_bound(workload, T, B, I, H)
                                           if name == "blockrnn" else None),
                }
                self.rows.append(row)


def run(opts):
    """The whole table run; returns the results dict (what --json saves)."""
    found = peers.Peers(opts.impls)     # parity only: this process times nothing
    info = header(found, opts)
    for line in found.skipped + found.notes:
        print(line)
    bench = Run(opts, found)
    print(f"\nparity checks (in this process, not timed):")
    for workload, shape in plan(opts):
        bench.check(workload, shape)
    big = sorted({",".join(map(str, s)) for w, s in plan(opts)
                  if bench.rounds_of(w, s) != bench.rounds})
    print(f"\ntiming: each implementation in its own process per round, {bench.rounds} "
          + (f"rounds ({bench.big_rounds} at {' '.join(big)}) " if big else "rounds ")
          + f"alternating {', '.join(IMPL_TITLES[i] for i in IMPLS if i in bench.tasks)};"
          f" per workload and round: warm-up calls for {opts.warmup:g} s (at least one) "
          f"and until the heap has settled (a call after the first takes no new page fault "
          f"or three the same number; at most {bench.warmup_max:g} s), "
          f"then up to {bench.reps} timed samples (each the mean of the calls of "
          f"~{bench.sample_target * 1e3:g} ms, or one longer call; at most {bench.budget:g} s), "
          "the best kept; MEDIAN over rounds reported (best and spread also shown)\n")
    with tempfile.TemporaryDirectory(prefix="blockrnn-bench-jax-") as cache_dir:
        bench.cache_dir = cache_dir
        for k, mode in enumerate(modes_of(opts)):
            samples = bench.time_mode(mode, memory=k == 0)
            bench.add_rows(mode, samples)
    info["worker_threads"] = {f"{w['mode']} {w['impl']}": w["thread_settings"]
                              for w in bench.workers if w["round"] == 0}
    return {"header": info, "roofline": bench.roofline, "rounds": bench.rounds,
            "big_rounds": bench.big_rounds, "round_seconds": bench.round_seconds,
            "reps": bench.reps, "warmup_s": opts.warmup,
            "warmup_max_s": bench.warmup_max, "statistic": "median",
            "rows": bench.rows,
            "parity": bench.parity, "workers": bench.workers,
            "messages": found.skipped + found.notes + bench.messages,
            "failed": bench.failed}


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------

COLUMNS = ("workload", "shape", "implementation", "median ms", "best ms", "spread",
           "GFLOP/s", "blockrnn/peer", "sgemm share", "CPU/wall", "threads",
           "peak RSS +MB", "tracemalloc MB", "bound MB")
MEMORY_COLUMNS = 3    # the last three: the mode that measured memory only


def _ms(v):
    return f"{v:.4f}" if v < 1 else f"{v:.3f}" if v < 100 else f"{v:.1f}"


def _mb(v):
    return "n/a" if v is None else f"{v / 2**20:.1f}"


def table_rows(rows, memory=True):
    """The table of ``rows`` (one mode) as lists of strings (COLUMNS order)."""
    out = []
    for r in rows:
        blk = r["impl"] == "blockrnn"
        cells = [
            r["workload_title"], r["shape_label"], r["impl_title"], _ms(r["median_ms"]),
            _ms(r["best_ms"]), f"{100 * r['spread']:.1f}%", f"{r['gflops']:.2f}",
            "-" if blk else ("n/a" if r["ratio_blockrnn_over_peer"] is None
                             else f"{r['ratio_blockrnn_over_peer']:.2f}"),
            f"{100 * r['sgemm_share']:.1f}%", f"{r['cpu_per_wall']:.2f}",
            str(r["threads"] or "n/a")]
        if memory:
            cells += [_mb(r["rss_peak_bytes"]), _mb(r["tracemalloc_peak_bytes"]) if blk else "-",
                      _mb(r["memory_bound_bytes"]) if blk else "-"]
        out.append(cells)
    return out


def _format(columns, rows, cells, left=3):
    widths = [max(len(c), *(len(r[k]) for r in cells)) if cells else len(c)
              for k, c in enumerate(columns)]
    fmt = lambda cs: "  ".join(  # noqa: E731
        c.ljust(w) if k < left else c.rjust(w) for k, (c, w) in enumerate(zip(cs, widths)))
    lines = [fmt(columns), "  ".join("-" * w for w in widths)]
    previous = None
    for r, cs in zip(rows, cells):
        key = (r["workload"], r["shape_label"])
        if previous is not None and key != previous:
            lines.append("")
        previous = key
        lines.append(fmt(cs))
    return "\n".join(lines)


def format_table(results, mode):
    rows = [r for r in results["rows"] if r["mode"] == mode]
    memory = any(r["rss_peak_bytes"] is not None or r["tracemalloc_peak_bytes"] is not None
                 for r in rows)
    columns = COLUMNS if memory else COLUMNS[:-MEMORY_COLUMNS]
    return (f"{MODE_TITLES[mode]}:\n"
            + _format(columns, rows, table_rows(rows, memory)))


def scaling_rows(results):
    """One dict per (workload, shape, impl) timed in both modes: one-core median /
    all-cores median (None where the machine has one usable CPU)."""
    by_key = {(r["workload"], tuple(r["shape"]), r["impl"], r["mode"]): r
              for r in results["rows"]}
    multi = results["header"]["usable_cpus"] >= 2
    out = []
    for r in results["rows"]:
        if r["mode"] != "all":
            continue
        one = by_key.get((r["workload"], tuple(r["shape"]), r["impl"], "one"))
        if one is None:
            continue
        out.append({"workload": r["workload"], "workload_title": r["workload_title"],
                    "shape": r["shape"], "shape_label": r["shape_label"], "impl": r["impl"],
                    "impl_title": r["impl_title"], "one_ms": one["median_ms"],
                    "all_ms": r["median_ms"],
                    "scaling": one["median_ms"] / r["median_ms"] if multi else None})
    return out


def format_scaling(results):
    rows = scaling_rows(results)
    columns = ("workload", "shape", "implementation", "one core ms", "all cores ms",
               "one / all")
    cells = [[r["workload_title"], r["shape_label"], r["impl_title"], _ms(r["one_ms"]),
              _ms(r["all_ms"]), "n/a (1 core)" if r["scaling"] is None
              else f"{r['scaling']:.2f}x"] for r in rows]
    return ("scaling, one core -> all cores (median times; "
            f"{results['header']['usable_cpus']} usable CPUs):\n"
            + _format(columns, rows, cells))


def format_model(results):
    """The model rows: time per step and how the pools share the cores."""
    rows = [r for r in results["rows"] if r["workload"] in MODEL_WORKLOADS]
    if not rows:
        return ""
    lines = [f"{WORKLOAD_TITLES[MODEL_WORKLOADS[0]]} (per step; CPU/wall = process CPU time"
             " / wall time, the cores busy on average; threads = the process's threads):"]
    for r in rows:
        ratio = r["ratio_blockrnn_over_peer"]
        lines.append(
            f"  {MODE_TITLES[r['mode']]:<9} {r['shape_label']:<16} {r['impl_title']:<9} "
            f"{_ms(r['median_ms']):>8} ms/step  CPU {_ms(r['median_ms'] * r['cpu_per_wall'])}"
            f" ms/step ({r['cpu_per_wall']:.2f} cores)  threads {r['threads']}"
            + (f"  blockrnn/nn.LSTM {ratio:.2f}" if ratio is not None else ""))
    return "\n".join(lines)


def legend(results):
    calls = {}
    for r in results["rows"]:
        calls.setdefault((r["workload_title"], r["impl_title"]), (r["call"], r["note"]))
    lines = ["implementations:"]
    width = max((len(wl) for wl, _ in calls), default=0)
    for (wl, impl), (call, note) in calls.items():
        lines.append(f"  {wl:<{width}} {impl:<13} {call}" + (f"  [{note}]" if note else ""))
    roof = ", ".join(f"{MODE_TITLES[m]} {v['gflops']:.1f}"
                     for m, v in results["roofline"].items())
    lines += [
        "notes:",
        f"  times: each implementation in its own process, {results['rounds']} rounds"
        + (f" ({results['big_rounds']} at shapes with >= {BIG_FLOPS:.0e} LSTM forward flops)"
           if results["big_rounds"] != results["rounds"] else "") + "; a "
        f"round keeps the best of up to {results['reps']} calls after "
        f"{results.get('warmup_s', 0):g} s of warm-up calls and until one takes no new page "
        f"fault (at most {results.get('warmup_max_s', 0):g} s); median and best over the "
        "rounds, spread = median / best - 1; cell rows: mean per call",
        "  blockrnn/peer = blockrnn median time / that peer's median time (< 1: blockrnn "
        "faster)",
        f"  sgemm share = GFLOP/s (median) / the mode's sgemm GFLOP/s ({roof}; "
        f"{next(iter(results['roofline'].values()))['n']}^3, own process); flops: LSTM "
        "2*T*B*(I+H)*4H, GRU 2*T*B*(I+H)*3H, x3 for fwd+bwd",
        "  CPU/wall: the worker's CPU time / wall time of the round's best sample; threads: "
        "the worker process's threads after the calls (/proc/self/status)",
        "  peak RSS +MB: VmHWM increase during one call after warm-up (resident memory kept "
        "by an allocator from earlier calls is not counted)",
        "  tracemalloc MB: blockrnn's NumPy allocation peak during one call (exact); "
        "bound MB: blockrnn outputs + one T x B x 4H workspace + B x H",
        "  LSTM 2-layer bidi: blockrnn.torch.LSTM vs nn.LSTM, same weights; flops summed over "
        "layers and directions (layer 1 reads 2H); tracemalloc sees its NumPy buffers only, "
        "no bound",
        f"  model: Embedding({peers.MODEL_VOCAB}, I) -> LSTM(I, H) -> Linear(H, "
        f"{peers.MODEL_VOCAB}), cross-entropy, backward, SGD step; flops: the LSTM's and the "
        "Linear's, x3",
    ]
    return "\n".join(lines)


def plot(results, path):
    """Grouped bars of GFLOP/s (median times) of the first mode's rows."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    mode = results["header"]["modes"][0]
    rows = [r for r in results["rows"]
            if r["workload"] in SEQUENCE_WORKLOADS and r["mode"] == mode]
    groups = list(dict.fromkeys((r["workload_title"], r["shape_label"]) for r in rows))
    impls = [i for i in IMPLS if any(r["impl"] == i for r in rows)]
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(groups) + 2), 5))
    width = 0.8 / max(1, len(impls))
    for k, name in enumerate(impls):
        xs, ys = [], []
        for g, key in enumerate(groups):
            for r in rows:
                if (r["workload_title"], r["shape_label"]) == key and r["impl"] == name:
                    xs.append(g - 0.4 + width * (k + 0.5))
                    ys.append(r["gflops"])
        ax.bar(xs, ys, width, label=IMPL_TITLES[name])
    roof = results["roofline"][mode]
    ax.axhline(roof["gflops"], color="k", linestyle="--",
               label=f"sgemm {roof['n']}^3 roofline ({roof['gflops']:.0f} GFLOP/s)")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{w}\n{s}" for w, s in groups], fontsize=8, rotation=30, ha="right")
    ax.set_ylabel("GFLOP/s (median time)")
    ax.set_title(f"blockrnn {results['header']['blockrnn']} vs peers, float32, "
                 f"{MODE_TITLES[mode]}, each in its own process")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    """Entry point of ``python -m blockrnn bench``; returns the exit status."""
    opts = parse_args(argv)
    if opts.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("error: --plot needs matplotlib, which is not installed "
                  "(pip install matplotlib)", file=sys.stderr)
            return 2
    for name in ("rounds", "big_rounds", "reps"):
        if getattr(opts, name) is not None and getattr(opts, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    if opts.serve:
        return serve.main_serve(opts)
    if opts.threads:
        if opts.num_threads:
            print("note: --num-threads does not apply to --threads; use --blas-threads")
        argv_threads = ["--counts", ",".join(map(str, opts.thread_counts)),
                        "--shape", *(",".join(map(str, s)) for s in opts.thread_shape),
                        "--blas-threads", ",".join(map(str, opts.blas_threads))]
        if opts.thread_duration is not None:
            argv_threads += ["--duration", str(opts.thread_duration)]
        if opts.quick:
            argv_threads.append("--quick")
        if opts.json:
            argv_threads += ["--json", opts.json]
        return threads.main(argv_threads)

    started = time.perf_counter()
    results = run(opts)
    results["targets"] = targets.evaluate(results)
    for mode in results["header"]["modes"]:
        print("\n" + format_table(results, mode))
    if len(results["header"]["modes"]) == 2:
        print("\n" + format_scaling(results))
    model = format_model(results)
    if model:
        print("\n" + model)
    print(legend(results))
    print(targets.format_verdicts(results["targets"]))
    results["seconds"] = time.perf_counter() - started
    print(f"benchmark took {results['seconds']:.0f} s")
    if results["failed"]:
        print("\n!!! SOME PARITY CHECKS OR blockrnn CALLS FAILED: see the lines marked !!! "
              "above !!!")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
        print(f"raw results saved to {opts.json}")
    if opts.plot:
        plot(results, opts.plot)
        print(f"plot saved to {opts.plot}")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())

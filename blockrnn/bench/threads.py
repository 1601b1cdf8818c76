"""Thread scaling of blockrnn: sequence inference from several Python threads.

    python -m blockrnn.bench.threads [--counts 1,2,4] [--shape 50,1,128,128 100,32,256,256]
                                     [--duration 2] [--quick] [--blas-threads default,1]
                                     [--json FILE]

(also ``python -m blockrnn bench --threads ...``.)

For each shape and thread count N, N Python threads start together (a barrier) and each
calls ``blockrnn.block_lstm_v2`` (peepholes, float32; shapes T,B,I,H = 50,1,128,128 and
100,32,256,256 by default) on its own inputs in a loop for ``--duration`` seconds.
Printed: aggregate throughput (sequences/s over all threads), the speed-up relative to 1
thread, and the mean latency of one call, then the thread-scaling target of that shape and
BLAS setting, if it has one (``blockrnn.bench.targets.THREAD_TARGETS``). blockrnn releases
the GIL for its whole compiled work, so the throughput should scale up to the number of usable CPUs (the machine's CPU count caps the speed-up: 4 threads
on 2 CPUs can give at most 2x). Every thread checks that its first result equals the
single-threaded one bit for bit; a mismatch is reported and makes the exit status 1.

The whole measurement is repeated for each ``--blas-threads`` setting (default
"default,1"): once with the thread counts as configured (OPENBLAS_NUM_THREADS,
OMP_NUM_THREADS or all CPUs), and once under ``threadpool_limits(n)`` -- what a server
calling blockrnn from as many threads as it has cores sets. That limit is applied as
threadpoolctl's limits work: OpenBLAS has one thread count per process, set from the
main thread; OpenMP's limit (which bounds blockrnn's packed-kernel threads) is a
per-thread setting of libgomp (omp_set_num_threads sets the calling thread's ICV only),
so every calling thread also enters ``threadpool_limits(n, user_api="openmp")`` itself.
A limit set in the main thread alone would leave each worker thread's calls on all CPUs.
"""
import argparse
import contextlib
import json
import sys
import threading
import time

import numpy as np

import blockrnn
from blockrnn.bench import measure, targets
from blockrnn.bench.peers import Problem

DEFAULT_COUNTS = (1, 2, 4)
# Batch 1, and a batched shape where the OpenBLAS threads and the Python threads meet.
DEFAULT_SHAPES = ((50, 1, 128, 128), (100, 32, 256, 256))


def scaling(counts=DEFAULT_COUNTS, shape=DEFAULT_SHAPES[0], duration=2.0, seed=0, out=print,
            blas="default"):
    """Run the scaling measurement; returns a list of dicts, one per thread count."""
    T, B, I, H = shape
    problems = [Problem(T, B, I, H, seed=seed) for _ in range(max(counts))]  # same values
    reference = blockrnn.block_lstm_v2(*problems[0].lstm_args(), use_peephole=True).h
    for p in problems:   # warm-up
        blockrnn.block_lstm_v2(*p.lstm_args(), use_peephole=True)
    results = []
    out(f"\nthread scaling: blockrnn.block_lstm_v2 (peepholes, float32), T,B,I,H = "
        f"{T},{B},{I},{H}; each thread loops for {duration:g} s on its own inputs; "
        f"usable CPUs: {measure.usable_cpus()}; threads: {blas_threads_text(blas)}")
    out(f"{'threads':>8} {'calls':>8} {'seconds':>8} {'sequences/s':>12} {'speed-up':>9} "
        f"{'ms/call':>9}  result check")
    base = None
    for n in counts:
        calls = [0] * n
        mismatches = [None] * n
        barrier = threading.Barrier(n + 1)
        stop = threading.Event()

        def worker(k):
            args = problems[k].lstm_args()
            with openmp_limit(blas):   # OpenMP's limit is per thread: set it in each
                barrier.wait()
                first = blockrnn.block_lstm_v2(*args, use_peephole=True).h
                if not np.array_equal(first, reference):
                    mismatches[k] = float(np.max(np.abs(first - reference)))
                count = 1
                while not stop.is_set():
                    blockrnn.block_lstm_v2(*args, use_peephole=True)
                    count += 1
                calls[k] = count

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
        for t in threads:
            t.start()
        barrier.wait()
        start = time.perf_counter()
        time.sleep(duration)
        stop.set()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        total = sum(calls)
        rate = total / elapsed
        base = base or rate
        bad = [m for m in mismatches if m is not None]
        row = {"shape": list(shape), "blas_threads": blas, "threads": n, "calls": total,
               "seconds": elapsed, "sequences_per_s": rate, "speedup": rate / base, "ms_per_call": 1e3 * n * elapsed / total,
               "bitwise_equal": not bad}
        results.append(row)
        check = "same bits as 1 thread" if not bad else f"MISMATCH (max diff {max(bad):.1e})"
        out(f"{n:>8} {total:>8} {elapsed:>8.2f} {rate:>12.1f} {rate / base:>8.2f}x "
            f"{row['ms_per_call']:>9.3f}  {check}")
    verdict = targets.thread_verdict(results, shape, blas)
    if verdict:
        out(verdict)
    return results


def parse_shape(text, n=4):
    values = tuple(int(v) for v in text.replace("x", ",").split(","))
    if len(values) != n or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected {n} positive integers, got {text!r}")
    return values


def add_arguments(parser, prefix=""):
    """The scaling options (``prefix`` = "thread-" when embedded in blockrnn.bench.run)."""
    parser.add_argument(f"--{prefix}counts", type=lambda s: tuple(int(v) for v in s.split(",")),
                        default=DEFAULT_COUNTS, help="thread counts (default 1,2,4)")
    parser.add_argument(f"--{prefix}shape", type=parse_shape, nargs="+",
                        default=list(DEFAULT_SHAPES),
                        help="T,B,I,H of the sequence, one or more (default 50,1,128,128 "
                             "100,32,256,256)")
    parser.add_argument(f"--{prefix}duration", type=float, default=None,
                        help="seconds per thread count (default 2, 0.5 with --quick)")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m blockrnn.bench.threads",
                                     description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument("--quick", action="store_true", help="0.5 s per thread count")
    add_blas_argument(parser)
    parser.add_argument("--json", metavar="FILE", help="save the results as JSON")
    args = parser.parse_args(argv)
    duration = args.duration if args.duration is not None else (0.5 if args.quick else 2.0)
    print(f"blockrnn {blockrnn.__version__}")
    if hasattr(blockrnn, "show_config"):
        blockrnn.show_config()
    results = []
    for shape in args.shape:
        for blas in args.blas_threads:
            results += run_with_blas_limit(blas, lambda: scaling(
                args.counts, shape, duration, blas=blas))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"thread_scaling": results}, f, indent=1)
    return 0 if all(r["bitwise_equal"] for r in results) else 1


def _blas_list(text):
    out = []
    for v in text.split(","):
        v = v.strip()
        if v != "default" and not (v.isdigit() and int(v) > 0):
            raise argparse.ArgumentTypeError(f"expected 'default' or a positive integer: {v!r}")
        out.append(v if v == "default" else int(v))
    return out


def add_blas_argument(parser, name="--blas-threads"):
    parser.add_argument(name, type=_blas_list, default=["default", 1],
                        help="comma-separated thread limits to measure under ('default' "
                             "= as configured; a number n = threadpool_limits(n): SciPy's "
                             "BLAS, and OpenMP in every calling thread); default: default,1")


def blas_threads_text(blas):
    if blas != "default":
        return (f"threadpool_limits({blas}) (BLAS process-wide, OpenMP in each calling "
                f"thread)")
    pools = [d for d in (measure.threadpool_info() or []) if d["user_api"] == "blas"
             and "scipy" in (d["filepath"] or "")]
    return "as configured" + (f" (BLAS {pools[0]['num_threads']})" if pools else "")


def openmp_limit(blas_threads):
    """threadpool_limits(n, user_api="openmp") for the calling thread (a no-op for
    "default"): libgomp keeps the limit per thread, so each worker sets its own."""
    if blas_threads == "default":
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits   # run_with_blas_limit checked it
    return threadpool_limits(limits=blas_threads, user_api="openmp")


def run_with_blas_limit(blas_threads, fn):
    if blas_threads == "default":
        return fn()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        print(f"threadpoolctl not installed: BLAS thread limit {blas_threads} skipped")
        return []
    with threadpool_limits(limits=blas_threads):   # BLAS for all threads, OpenMP for this one
        return fn()


if __name__ == "__main__":
    sys.exit(main())

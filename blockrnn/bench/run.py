"""blockrnn vs its peers: ``python -m blockrnn bench`` (``blockrnn.bench.run.main``).

Usage::

    python -m blockrnn bench [--quick] [--repeats N] [--shapes T,B,I,H ...]
                             [--workloads lstm_fwd lstm_fwdbwd gru_fwd gru_fwdbwd lstm2bi_fwd
                                          lstm2bi_fwdbwd lstm_cell gru_cell]
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
  forward+backward, for blockrnn, TensorFlow raw ops, PyTorch and ONNX Runtime (each only
  where it has the op; inference-only ORT has no backward). LSTM peepholes are on for
  blockrnn, TF and ORT; torch has none.
* A 2-layer bidirectional LSTM (``lstm2bi_fwd``, ``lstm2bi_fwdbwd``) at (100,32,256,256)
  -- or at every ``--shapes`` shape when given --: ``blockrnn.torch.LSTM`` against
  ``torch.nn.LSTM`` with the same configuration and weights (``LSTM.from_torch``), forward
  and forward+backward, in the same table.
* The batch-1 cell latency: LSTMBlockCell / GRUBlockCell at B=1, I=H=32 (blockrnn vs TF
  eager vs torch nn.LSTMCell / nn.GRUCell under no_grad).

Method: every implementation is first checked against blockrnn (or a NumPy reference) once
-- a failing one is reported loudly and not timed -- then called once to warm up. The
implementations of one workload are then timed in turn, round-robin, ``--repeats`` rounds
(default 7; 2 with --quick); the table shows the BEST round (and the median). A round is
one call for the sequence workloads and the mean of enough calls to last ~20 ms for the
cell latency. Then one more call per implementation measures peak memory: the peak RSS
increase during the call (VmHWM after resetting it through /proc/self/clear_refs, minus
the RSS before; Linux only; allocators that keep memory from earlier calls make it a lower
bound) and, for blockrnn, the tracemalloc peak (NumPy reports its buffers to tracemalloc,
so this is blockrnn's exact allocation peak). blockrnn's memory bound -- its outputs plus
one T x B x 4H workspace and B x H -- is shown next to it.

Columns: GFLOP/s = matmul flops / best time, flops = 2*T*B*(I+H)*4H for the LSTM forward
(3H for the GRU), x3 with the backward; ``blockrnn/peer`` = blockrnn's best time divided by
that peer's best time (below 1: blockrnn is faster); ``sgemm share`` = flops / (time x the
peak sgemm GFLOP/s measured in the same run with scipy.linalg.blas.sgemm on 2048^3 float32,
best of 3, at the start and again at the end: the better of the two).

After the table, the targets are judged on this run, each with its measured ratio
and roofline floor (``blockrnn.bench.targets``; also saved under "targets" by --json).

Threads: every library uses ``--num-threads`` threads (default: OMP_NUM_THREADS, else the
usable CPUs): TF intra-op threads, torch.set_num_threads, ORT intra_op_num_threads; with
--num-threads given, SciPy's BLAS threads are limited to it too (threadpoolctl).

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
import sys
import time

import numpy as np
import scipy

import blockrnn
from blockrnn.bench import measure, peers, targets, threads
from blockrnn.bench.peers import (CELL_SHAPE, CELL_WORKLOADS, DEFAULT_SHAPES, IMPL_TITLES, IMPLS,
                              SEQUENCE_WORKLOADS, STACKED_SHAPES, STACKED_WORKLOADS,
                              WORKLOAD_TITLES, WORKLOADS)

CELL_TARGET_S = 0.02         # one cell-latency sample lasts about this long
QUICK_CELL_TARGET_S = 0.005


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m blockrnn bench",
        description="Time blockrnn against TensorFlow raw ops, PyTorch, ONNX Runtime and JAX "
                    "(whichever are installed). See the module docstring of "
                    "blockrnn.bench.run for the method.")
    parser.add_argument("--quick", action="store_true",
                        help="2 repeats, shorter cell samples, sgemm best of 1 (CI smoke)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="round-robin rounds per workload (default 7, --quick 2)")
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
    parser.add_argument("--num-threads", type=int, default=None,
                        help="threads for every library (default OMP_NUM_THREADS or the "
                             "usable CPUs); also limits SciPy's BLAS when given")
    parser.add_argument("--settle", type=float, default=measure.SETTLE_S, metavar="S",
                        help="pause before each timed sample so that the previous "
                             "implementation's spinning threads are idle (default %(default)s s,"
                             " --quick too)")
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
    return parser.parse_args(argv)


def _thread_count(opts):
    if opts.num_threads:
        return opts.num_threads
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        return measure.usable_cpus()


# --------------------------------------------------------------------------
# Header
# --------------------------------------------------------------------------

def header(found, n_threads, opts):
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
        "threads_used": n_threads,
        "env": {k: os.environ.get(k) for k in measure.THREAD_ENV},
        "peer_threads": found.thread_settings(),
        "threadpools": measure.threadpool_info(),
        "blas_limit": opts.num_threads,
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
    print("thread settings: " + ", ".join(f"{k}={v}" for k, v in info["env"].items())
          + f"; threads per library = {n_threads}"
          + (f" (SciPy BLAS limited to {opts.num_threads})" if opts.num_threads else ""))
    if info["peer_threads"]:
        print("  peers: " + ", ".join(f"{k} = {v}" for k, v in info["peer_threads"].items()))
    if info["threadpools"] is None:
        print("  threadpoolctl not installed: BLAS thread pools not shown")
    else:
        for pool in info["threadpools"]:
            print(f"  threadpoolctl: {pool['user_api']}/{pool['internal_api']} "
                  f"{pool['version'] or ''} num_threads={pool['num_threads']} "
                  f"({os.path.basename(pool['filepath'] or '')})")
    return info


# --------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------

def _shape_label(workload, shape):
    if workload in CELL_WORKLOADS:
        B, I, H = shape
        return f"B,I,H={B},{I},{H}"
    return ",".join(map(str, shape))


class Run:
    def __init__(self, opts, found, roofline):
        self.opts, self.found, self.roofline = opts, found, roofline
        self.rows, self.parity, self.messages = [], [], []
        self.failed = False
        self.repeats = opts.repeats or (2 if opts.quick else 7)
        # --quick keeps the pause: without it a short call that follows a peer's
        # spinning threads waits for a core (measured, GRU forward at 50,8,64,64 after
        # ONNX Runtime: 9.2 ms without the pause, 0.47 ms with it).
        self.settle = opts.settle
        self.cell_target = QUICK_CELL_TARGET_S if opts.quick else CELL_TARGET_S

    def say(self, text, loud=False):
        if loud:
            text = f"!!! {text} !!!"
        print(text)
        self.messages.append(text)

    def workload(self, workload, problem, shape):
        T, B, I, H = (1, *shape) if workload in CELL_WORKLOADS else shape
        label = _shape_label(workload, shape)
        title = f"{WORKLOAD_TITLES[workload]} [{label}]"
        impls, messages = peers.build(workload, problem, self.found, self.opts.impls)
        for m in messages:
            self.say(f"  {title}: {m}")
        live = []
        for impl in impls:   # parity first: never time a wrong result
            if impl.check is None:
                live.append(impl)
                continue
            try:
                result = impl.check()
            except Exception as exc:  # noqa: BLE001
                self.say(f"{title}: {IMPL_TITLES[impl.impl]} parity check raised "
                         f"{type(exc).__name__}: {exc}; row excluded", loud=True)
                self.failed = True
                continue
            self.parity.append({"workload": workload, "shape": list(shape),
                                "impl": impl.impl, "ok": result.ok, "text": result.text})
            if result.ok:
                print(f"  parity {title} {IMPL_TITLES[impl.impl]}: {result.text}")
                live.append(impl)
            else:
                self.say(f"PARITY FAILURE {title} {IMPL_TITLES[impl.impl]}: {result.text}; "
                         "row excluded", loud=True)
                self.failed = True
        fns, numbers = {}, {}
        for impl in live:    # warm-up (and calibration of the cell-latency loops)
            try:
                target = self.cell_target if workload in CELL_WORKLOADS else 0
                impl.run()
                numbers[impl.impl] = measure.calibrate(impl.run, target)
                fns[impl.impl] = impl.run
            except Exception as exc:  # noqa: BLE001
                self._call_failed(title, impl.impl, exc)

        samples = measure.round_robin(fns, self.repeats, numbers,
                                      lambda name, exc: self._call_failed(title, name, exc),
                                      settle=self.settle)
        by_name = {impl.impl: impl for impl in live}
        flops = peers.flops(workload, T, B, I, H)
        base = measure.summarize(samples["blockrnn"])["best_s"] if "blockrnn" in samples \
            else None
        for name in IMPLS:
            if name not in samples:
                continue
            impl = by_name[name]
            stats = measure.summarize(samples[name])
            best = stats["best_s"]
            gflops = flops / best / 1e9
            row = {
                "workload": workload, "workload_title": WORKLOAD_TITLES[workload],
                "shape": list(shape), "shape_label": label, "impl": name,
                "impl_title": IMPL_TITLES[name], "call": impl.label, "note": impl.note,
                "best_ms": 1e3 * best, "median_ms": 1e3 * stats["median_s"],
                "samples_ms": [1e3 * s for s in stats["samples_s"]],
                "calls_per_sample": numbers.get(name, 1), "flops": flops, "gflops": gflops,
                "ratio_blockrnn_over_peer": (base / best if base is not None
                                             and name != "blockrnn" else None),
                "sgemm_share": gflops / self.roofline["gflops"],
                "rss_peak_bytes": measure.rss_peak_increase(impl.run),
                "tracemalloc_peak_bytes": (measure.tracemalloc_peak(impl.run)
                                           if name == "blockrnn" else None),
                "memory_bound_bytes": (peers.memory_bound(workload, T, B, I, H)
                                       if name == "blockrnn" else None),
            }
            self.rows.append(row)
            print(f"  timed {title} {IMPL_TITLES[name]}: best {row['best_ms']:.4g} ms, "
                  f"{gflops:.3g} GFLOP/s")

    def _call_failed(self, title, name, exc):
        loud = name == "blockrnn"
        self.failed |= loud
        self.say(f"{title}: {IMPL_TITLES[name]} raised {type(exc).__name__}: {exc}; "
                 "row skipped", loud=loud)


def run(opts):
    """The whole table run; returns the results dict (what --json saves)."""
    n_threads = _thread_count(opts)
    found = peers.Peers(opts.impls, threads=n_threads)
    info = header(found, n_threads, opts)
    for line in found.skipped + found.notes:
        print(line)
    if not hasattr(blockrnn, "block_gru") and {"gru_fwd", "gru_fwdbwd"} & set(opts.workloads):
        print("blockrnn has no block_gru yet: blockrnn GRU sequence rows skipped")
    sg_repeats = 1 if opts.quick else 3
    roofline = measure.sgemm_peak(opts.sgemm_size, sg_repeats)
    print(f"sgemm roofline: scipy.linalg.blas.sgemm {opts.sgemm_size}^3 float32, best of "
          f"{sg_repeats}: {roofline['gflops']:.1f} GFLOP/s (measured again at the end; the "
          "better of the two is used)")
    bench = Run(opts, found, roofline)
    print(f"timing: round-robin over implementations, {bench.repeats} rounds, BEST round "
          f"reported (median also shown); {bench.settle:g} s pause before each sample "
          "(idle cores: no thread of the previous implementation still spinning)\n")
    for shape in (opts.shapes or DEFAULT_SHAPES):
        problem = peers.Problem(*shape, seed=opts.seed)
        for workload in SEQUENCE_WORKLOADS:
            default_only = (workload in STACKED_WORKLOADS and opts.shapes is None
                            and tuple(shape) not in STACKED_SHAPES)
            if workload in opts.workloads and not default_only:
                bench.workload(workload, problem, shape)
    cell = peers.CellProblem(*opts.cell_shape, seed=opts.seed)
    for workload in CELL_WORKLOADS:
        if workload in opts.workloads:
            bench.workload(workload, cell, opts.cell_shape)
    again = measure.sgemm_peak(opts.sgemm_size, sg_repeats)
    print(f"sgemm roofline at the end: {again['gflops']:.1f} GFLOP/s")
    if again["gflops"] > roofline["gflops"]:
        roofline.update(again)
        for row in bench.rows:
            row["sgemm_share"] = row["gflops"] / roofline["gflops"]
    return {"header": info, "roofline": roofline, "repeats": bench.repeats,
            "statistic": "best", "rows": bench.rows, "parity": bench.parity,
            "messages": found.skipped + found.notes + bench.messages, "failed": bench.failed}


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------

COLUMNS = ("workload", "shape", "implementation", "best ms", "median ms", "GFLOP/s",
           "blockrnn/peer", "sgemm share", "peak RSS +MB", "tracemalloc MB", "bound MB")


def _ms(v):
    return f"{v:.4f}" if v < 1 else f"{v:.3f}" if v < 100 else f"{v:.1f}"


def _mb(v):
    return "n/a" if v is None else f"{v / 2**20:.1f}"


def table_rows(results):
    """The table as lists of strings (COLUMNS order)."""
    out = []
    for r in results["rows"]:
        blk = r["impl"] == "blockrnn"
        out.append([
            r["workload_title"], r["shape_label"], r["impl_title"], _ms(r["best_ms"]),
            _ms(r["median_ms"]), f"{r['gflops']:.2f}",
            "-" if blk else ("n/a" if r["ratio_blockrnn_over_peer"] is None
                             else f"{r['ratio_blockrnn_over_peer']:.2f}"),
            f"{100 * r['sgemm_share']:.1f}%", _mb(r["rss_peak_bytes"]),
            _mb(r["tracemalloc_peak_bytes"]) if blk else "-",
            _mb(r["memory_bound_bytes"]) if blk else "-"])
    return out


def format_table(results):
    rows = table_rows(results)
    widths = [max(len(c), *(len(r[k]) for r in rows)) if rows else len(c)
              for k, c in enumerate(COLUMNS)]
    fmt = lambda cells: "  ".join(  # noqa: E731
        c.ljust(w) if k < 3 else c.rjust(w) for k, (c, w) in enumerate(zip(cells, widths)))
    lines = [fmt(COLUMNS), "  ".join("-" * w for w in widths)]
    previous = None
    for r, cells in zip(results["rows"], rows):
        key = (r["workload"], r["shape_label"])
        if previous is not None and key != previous:
            lines.append("")
        previous = key
        lines.append(fmt(cells))
    return "\n".join(lines)


def legend(results):
    calls = {}
    for r in results["rows"]:
        calls.setdefault((r["workload_title"], r["impl_title"]), (r["call"], r["note"]))
    lines = ["implementations:"]
    for (wl, impl), (call, note) in calls.items():
        lines.append(f"  {wl:<13} {impl:<13} {call}" + (f"  [{note}]" if note else ""))
    roof = results["roofline"]
    lines += [
        "notes:",
        f"  times: best of {results['repeats']} round-robin rounds (median also shown); "
        "cell rows: mean per call within a round",
        "  blockrnn/peer = blockrnn best time / that peer's best time (< 1: blockrnn faster)",
        f"  sgemm share = GFLOP/s / {roof['gflops']:.1f} (sgemm {roof['n']}^3 in this run); "
        "flops: LSTM 2*T*B*(I+H)*4H, GRU 2*T*B*(I+H)*3H, x3 for fwd+bwd",
        "  peak RSS +MB: VmHWM increase during one call after warm-up (resident memory kept "
        "by an allocator from earlier calls is not counted)",
        "  tracemalloc MB: blockrnn's NumPy allocation peak during one call (exact); "
        "bound MB: blockrnn outputs + one T x B x 4H workspace + B x H",
        "  LSTM 2-layer bidi: blockrnn.torch.LSTM vs nn.LSTM, same weights; flops summed over "
        "layers and directions (layer 1 reads 2H); tracemalloc sees its NumPy buffers only, "
        "no bound",
    ]
    return "\n".join(lines)


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in results["rows"] if r["workload"] in SEQUENCE_WORKLOADS]
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
    peak = results["roofline"]["gflops"]
    ax.axhline(peak, color="k", linestyle="--",
               label=f"sgemm {results['roofline']['n']}^3 roofline ({peak:.0f} GFLOP/s)")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{w}\n{s}" for w, s in groups], fontsize=8, rotation=30, ha="right")
    ax.set_ylabel("GFLOP/s (best time)")
    ax.set_title(f"blockrnn {results['header']['blockrnn']} vs peers, float32, "
                 f"{results['header']['threads_used']} threads")
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
    if opts.repeats is not None and opts.repeats < 1:
        print("error: --repeats must be >= 1", file=sys.stderr)
        return 2
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

    limit = contextlib.nullcontext()
    if opts.num_threads:
        try:
            from threadpoolctl import threadpool_limits
            limit = threadpool_limits(limits=opts.num_threads, user_api="blas")
        except ImportError:
            print("threadpoolctl not installed: SciPy's BLAS threads not limited")
    with limit:
        results = run(opts)
    results["targets"] = targets.evaluate(results)
    print("\n" + format_table(results))
    print(legend(results))
    print(targets.format_verdicts(results["targets"]))
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

"""The performance targets, judged on one run of the table.

A ratio target holds when blockrnn's best time divided by the peer's best time
in the same run is at most the bound; the roofline target when blockrnn's
GFLOP/s is at least that share of the run's sgemm peak. Next to each sequence
ratio target stands its roofline floor: the ratio blockrnn would reach if all
its matmul flops ran at the run's sgemm peak, flops / peak / (peer's time). A
floor above the bound means no implementation that multiplies with this sgemm
can meet the target in this run. A target whose rows are missing (peer not
installed, workload or shape not run) is "not measured".

The thread-scaling targets (``THREAD_TARGETS``: two Python threads' throughput
over one thread's, per shape and BLAS setting) are judged by the ``--threads``
mode.
"""
from blockrnn.bench.peers import CELL_WORKLOADS, IMPL_TITLES, WORKLOAD_TITLES

_BIG, _MID, _LONG, _ONE = (100, 64, 512, 512), (100, 32, 256, 256), (200, 16, 128, 256), \
    (50, 1, 128, 128)
_BATCHED = (_MID, _BIG, _LONG)

# (workload, shape, peer -- or "sgemm" for the roofline share --, bound)
TARGETS = (
    ("lstm_fwd", _BIG, "ort", 1.0),
    ("lstm_fwd", _MID, "ort", 1.1),
    ("lstm_fwd", _LONG, "ort", 1.1),
    *(("gru_fwd", shape, "ort", 1.0) for shape in _BATCHED),
    # LSTM fwd+bwd vs PyTorch: <= 1.0 at every shape; at batch 1 the stricter 0.5 below.
    *(("lstm_fwdbwd", shape, "torch", 1.0) for shape in _BATCHED),
    *(("gru_fwdbwd", shape, "torch", 0.7) for shape in (*_BATCHED, _ONE)),
    ("lstm_fwdbwd", _BIG, "sgemm", 0.85),
    ("lstm_fwd", _ONE, "ort", 0.8),
    ("gru_fwd", _ONE, "ort", 0.8),
    ("lstm_fwdbwd", _ONE, "torch", 0.5),
    # The 2-layer bidirectional LSTM module against nn.LSTM's (issue 21).
    ("lstm2bi_fwd", _MID, "torch", 1.0),
    ("lstm2bi_fwdbwd", _MID, "torch", 1.0),
)

# (shape, BLAS threads -- "default" or a threadpool_limits number --, bound on the
# throughput of two Python threads over one thread's)
THREAD_TARGETS = (
    (_ONE, "default", 1.8),
    (_MID, "default", 0.95),
    (_MID, 1, 1.8),
)


def evaluate(results, targets=TARGETS):
    """One dict per target: the bound, the measured value, met (None if not
    measured) and the roofline floor of a sequence ratio target (else None)."""
    rows = {(r["workload"], tuple(r["shape"]), r["impl"]): r for r in results["rows"]}
    peak_flops = results["roofline"]["gflops"] * 1e9
    verdicts = []
    for workload, shape, peer, bound in targets:
        own = rows.get((workload, tuple(shape), "blockrnn"))
        other = rows.get((workload, tuple(shape), peer))
        value = met = floor = None
        if own is not None and peer == "sgemm":
            value = own["sgemm_share"]
            met = value >= bound
        elif own is not None and other is not None:
            value = own["best_ms"] / other["best_ms"]
            met = value <= bound
            if workload not in CELL_WORKLOADS:
                floor = own["flops"] / peak_flops / (other["best_ms"] * 1e-3)
        verdicts.append({"workload": workload, "shape": list(shape), "peer": peer,
                         "bound": bound, "value": value, "met": met, "floor": floor})
    return verdicts


def describe(v):
    """The target of a verdict as text, e.g. 'LSTM fwd+bwd 100,32,256,256: blockrnn /
    TensorFlow <= 0.2'."""
    shape = ",".join(map(str, v["shape"]))
    if v["workload"] in CELL_WORKLOADS:
        shape = "B,I,H=" + shape
    if v["peer"] == "sgemm":
        goal = f"sgemm share >= {100 * v['bound']:.0f}%"
    else:
        goal = f"blockrnn / {IMPL_TITLES[v['peer']]} <= {v['bound']:g}"
    return f"{WORKLOAD_TITLES[v['workload']]} {shape}: {goal}"


def format_verdicts(verdicts):
    texts = [describe(v) for v in verdicts]
    width = max(map(len, texts), default=0)
    lines = ["targets (roofline floor: the ratio if blockrnn ran all its flops at this "
             "run's sgemm peak):"]
    for v, text in zip(verdicts, texts):
        if v["met"] is None:
            lines.append(f"  {text:<{width}}  not measured")
            continue
        value = (f"{100 * v['value']:.1f}%" if v["peer"] == "sgemm"
                 else f"{v['value']:.3f}")   # 3 decimals: 0.053 is not 0.05
        line = f"  {text:<{width}}  {value:>6}  {'met' if v['met'] else 'MISSED'}"
        if v["floor"] is not None:
            line += f"  (roofline floor {v['floor']:.3f})"
        lines.append(line)
    met = sum(v["met"] is True for v in verdicts)
    measured = sum(v["met"] is not None for v in verdicts)
    lines.append(f"  {met} of {measured} measured targets met; the thread-scaling targets "
                 f"are judged by --threads")
    return "\n".join(lines)


def _shape_text(shape):
    return ",".join(map(str, shape))


def thread_verdict(rows, shape, blas="default", thread_targets=THREAD_TARGETS):
    """The thread-scaling target of (shape, BLAS setting) as text, from
    blockrnn.bench.threads.scaling's rows of that setting; None without such a
    target or without a 1-thread and a 2-thread row."""
    bounds = [b for s, bl, b in thread_targets if tuple(s) == tuple(shape) and bl == blas]
    by_count = {r["threads"]: r for r in rows}
    if not bounds or 1 not in by_count or 2 not in by_count:
        return None
    bound = bounds[0]
    speedup = by_count[2]["sequences_per_s"] / by_count[1]["sequences_per_s"]
    setting = "BLAS as configured" if blas == "default" else f"threadpool_limits({blas})"
    return (f"target: 2 threads >= {bound:g}x one thread's throughput at "
            f"{_shape_text(shape)} ({setting}): {speedup:.2f}x, "
            f"{'met' if speedup >= bound else 'MISSED'}")

"""Issue 3's performance targets, judged on one run of the table.

A ratio target holds when blockrnn's best time divided by the peer's best time
in the same run is at most the bound; the roofline target when blockrnn's
GFLOP/s is at least that share of the run's sgemm peak. Next to each sequence
ratio target stands its roofline floor: the ratio blockrnn would reach if all
its matmul flops ran at the run's sgemm peak, flops / peak / (peer's time). A
floor above the bound means no implementation that multiplies with this sgemm
can meet the target in this run. (The cell targets are per-call overhead, with
about 10^4 flops a call: no floor.) A target whose rows are missing (peer not
installed, workload or shape not run) is "not measured".

The thread-scaling target (two Python threads at least 1.7x one thread's
batch-1 throughput) is judged by the ``--threads`` mode, ``THREAD_TARGET``.
"""
from blockrnn.bench.peers import CELL_WORKLOADS, IMPL_TITLES, WORKLOAD_TITLES

# (workload, shape, peer -- or "sgemm" for the roofline share --, bound)
TARGETS = (
    ("lstm_fwdbwd", (100, 32, 256, 256), "tf", 0.2),
    ("lstm_fwdbwd", (100, 32, 256, 256), "torch", 0.67),
    ("lstm_fwdbwd", (100, 64, 512, 512), "tf", 0.35),
    ("lstm_fwdbwd", (100, 64, 512, 512), "torch", 0.8),
    ("lstm_fwdbwd", (100, 64, 512, 512), "sgemm", 0.75),
    ("lstm_fwdbwd", (200, 16, 128, 256), "torch", 1.0),
    ("lstm_fwd", (100, 64, 512, 512), "ort", 1.2),
    ("lstm_fwd", (100, 32, 256, 256), "ort", 1.5),
    ("lstm_fwdbwd", (50, 1, 128, 128), "tf", 0.1),
    ("lstm_fwdbwd", (50, 1, 128, 128), "torch", 1.0),
    ("lstm_cell", (1, 32, 32), "tf", 0.05),
    ("gru_cell", (1, 32, 32), "tf", 0.05),
)
THREAD_TARGET = 1.7


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
    lines = ["targets of issue 3 in this run (roofline floor: the ratio if blockrnn ran "
             "all its flops at this run's sgemm peak):"]
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
    lines.append(f"  {met} of {measured} measured targets met; the thread-scaling target "
                 f"(2 threads >= {THREAD_TARGET}x) is judged by --threads")
    return "\n".join(lines)


def thread_verdict(rows):
    """The thread-scaling target as text, from blockrnn.bench.threads.scaling's rows of
    one BLAS setting (None without a 1-thread and a 2-thread row)."""
    by_count = {r["threads"]: r for r in rows}
    if 1 not in by_count or 2 not in by_count:
        return None
    speedup = by_count[2]["sequences_per_s"] / by_count[1]["sequences_per_s"]
    return (f"target of issue 3: 2 threads >= {THREAD_TARGET}x one thread's throughput: "
            f"{speedup:.2f}x, {'met' if speedup >= THREAD_TARGET else 'MISSED'}")

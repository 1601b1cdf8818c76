"""The performance targets (issue 25), judged on one run of the tables.

Every time is a MEDIAN over fresh-process rounds (``blockrnn.bench.run``). A ratio
target holds when blockrnn's median time divided by the peer's median time, in the same
mode (all cores or one core), is at most the bound; the roofline target when blockrnn's
GFLOP/s is at least that share of the mode's sgemm peak; a scaling target when
blockrnn's one-core median divided by its all-cores median is at least the bound (n/a on
a machine with one usable CPU); the spread target of a mode when every blockrnn row's
median is within ``SPREAD_BOUND`` of its best (the peers' rows of the mode are counted
beside it, not judged: a host whose speed drifts moves every implementation). Next to
each sequence ratio target stands its roofline floor: the ratio blockrnn would reach if
all its matmul flops ran at the mode's sgemm peak, flops / peak / (peer's time). A
floor above the bound means no implementation that multiplies with this sgemm can meet
the target in this run. A target whose rows are missing (peer not installed, workload,
shape or mode not run) is "not measured".

The thread-scaling targets (``THREAD_TARGETS``: two Python threads' throughput
over one thread's, per shape and BLAS setting) are judged by the ``--threads``
mode.
"""
from blockrnn.bench.peers import CELL_WORKLOADS, IMPL_TITLES, WORKLOAD_TITLES

_BIG, _MID, _LONG, _ONE = (100, 64, 512, 512), (100, 32, 256, 256), (200, 16, 128, 256), \
    (50, 1, 128, 128)
_BATCHED = (_MID, _LONG, _BIG)

# (mode -- "all", "one", or "scaling" --, workload, shape, peer -- an implementation,
# "sgemm" for the roofline share, "scaling" for one core / all cores --, bound)
# The forward targets against ONNX Runtime judge the inference forward (lstm_infer,
# gru_infer): ONNX Runtime's LSTM and GRU compute y and the final states, as it does;
# block_lstm_v2 (lstm_fwd) also writes TensorFlow's seven gate outputs for a backward.
TARGETS = (
    # all cores: blockrnn / peer (medians)
    *(("all", "lstm_infer", s, "ort", 0.95) for s in _BATCHED),
    *(("all", "gru_infer", s, "ort", 0.8) for s in _BATCHED),
    *(("all", "lstm_fwdbwd", s, "torch", 0.9) for s in _BATCHED),
    *(("all", "gru_fwdbwd", s, "torch", 0.6) for s in _BATCHED),
    ("all", "lstm_infer", _ONE, "ort", 0.6),
    ("all", "gru_infer", _ONE, "ort", 0.6),
    ("all", "lstm_fwdbwd", _ONE, "torch", 0.5),
    ("all", "lstm_fwdbwd", _BIG, "sgemm", 0.85),
    # one core
    *(("one", "lstm_infer", s, "ort", 0.9) for s in (_MID, _BIG)),
    *(("one", "lstm_fwdbwd", s, "torch", 0.85) for s in (_MID, _BIG)),
    *(("one", "gru_fwdbwd", s, "torch", 0.6) for s in (_MID, _BIG)),
    # one core -> all cores: blockrnn's speed-up
    *(("scaling", w, _MID, "scaling", 1.8)
      for w in ("lstm_fwd", "lstm_fwdbwd", "gru_fwd", "gru_fwdbwd")),
    ("scaling", "lstm_fwdbwd", _BIG, "scaling", 1.8),
)
# Spread (per mode): every blockrnn row's median <= SPREAD_BOUND x its best.
SPREAD_BOUND = 1.10
MODE_TITLES = {"all": "all cores", "one": "one core", "scaling": "one core -> all cores"}

# (shape, BLAS threads -- "default" or a threadpool_limits number --, bound on the
# throughput of two Python threads over one thread's)
THREAD_TARGETS = (
    (_ONE, "default", 1.8),
    (_MID, "default", 0.95),
    (_MID, 1, 1.8),
)


def evaluate(results, targets=TARGETS, spread_bound=SPREAD_BOUND):
    """One dict per target: the bound, the measured value, met (None if not measured
    or not applicable) and the roofline floor of a sequence ratio target (else None).
    Then one spread verdict per mode that has blockrnn rows (the worst row named)."""
    rows = {(r["mode"], r["workload"], tuple(r["shape"]), r["impl"]): r
            for r in results["rows"]}
    multi = results["header"]["usable_cpus"] >= 2
    verdicts = []
    for mode, workload, shape, peer, bound in targets:
        v = {"mode": mode, "workload": workload, "shape": list(shape), "peer": peer,
             "bound": bound, "value": None, "met": None, "floor": None, "note": None}
        verdicts.append(v)
        if peer == "scaling":
            one = rows.get(("one", workload, tuple(shape), "blockrnn"))
            every = rows.get(("all", workload, tuple(shape), "blockrnn"))
            if not multi:
                v["note"] = "n/a (1 usable CPU)"
            elif one is not None and every is not None:
                v["value"] = one["median_ms"] / every["median_ms"]
                v["met"] = v["value"] >= bound
            continue
        own = rows.get((mode, workload, tuple(shape), "blockrnn"))
        other = rows.get((mode, workload, tuple(shape), peer))
        if own is not None and peer == "sgemm":
            v["value"] = own["sgemm_share"]
            v["met"] = v["value"] >= bound
        elif own is not None and other is not None:
            v["value"] = own["median_ms"] / other["median_ms"]
            v["met"] = v["value"] <= bound
            if workload not in CELL_WORKLOADS:
                peak = results["roofline"][mode]["gflops"] * 1e9
                v["floor"] = own["flops"] / peak / (other["median_ms"] * 1e-3)

    def spread(r):
        return r["median_ms"] / r["best_ms"]

    for mode in ("all", "one"):
        own = [r for r in results["rows"] if r["mode"] == mode and r["impl"] == "blockrnn"]
        if not own:
            continue
        worst = max(own, key=spread)
        value = spread(worst)
        # The peers' spreads in the same run, beside it: how much of a miss is the
        # machine's (every implementation's rounds vary alike) rather than blockrnn's.
        others = [r for r in results["rows"] if r["mode"] == mode and r["impl"] != "blockrnn"]
        verdicts.append({"mode": mode, "workload": None, "shape": None, "peer": "spread",
                         "bound": spread_bound, "value": value, "met": value <= spread_bound,
                         "floor": None, "rows": len(own),
                         "note": f"worst: {WORKLOAD_TITLES[worst['workload']]} "
                                 f"{worst['shape_label']}",
                         "over": sum(spread(r) > spread_bound for r in own),
                         "peer_rows": len(others),
                         "peer_over": sum(spread(r) > spread_bound for r in others),
                         "peer_worst": max(map(spread, others), default=None)})
    return verdicts


def describe(v):
    """The target of a verdict as text, e.g. 'all cores, LSTM fwd+bwd 100,32,256,256:
    blockrnn / PyTorch <= 0.9'."""
    mode = MODE_TITLES[v["mode"]]
    if v["peer"] == "spread":
        return (f"{mode}, spread: every blockrnn row's median <= {v['bound']:g} x its best "
                f"({v['rows']} rows)")
    shape = ",".join(map(str, v["shape"]))
    if v["workload"] in CELL_WORKLOADS:
        shape = "B,I,H=" + shape
    if v["peer"] == "sgemm":
        goal = f"sgemm share >= {100 * v['bound']:.0f}%"
    elif v["peer"] == "scaling":
        goal = f"blockrnn one core / all cores >= {v['bound']:g}x"
    else:
        goal = f"blockrnn / {IMPL_TITLES[v['peer']]} <= {v['bound']:g}"
    return f"{mode}, {WORKLOAD_TITLES[v['workload']]} {shape}: {goal}"


def format_verdicts(verdicts):
    texts = [describe(v) for v in verdicts]
    width = max(map(len, texts), default=0)
    lines = ["targets (medians over fresh-process rounds; roofline floor: the ratio if "
             "blockrnn ran all its flops at the mode's sgemm peak):"]
    for v, text in zip(verdicts, texts):
        if v["met"] is None:
            lines.append(f"  {text:<{width}}  {v['note'] or 'not measured'}")
            continue
        if v["peer"] == "sgemm":
            value = f"{100 * v['value']:.1f}%"
        elif v["peer"] == "scaling":
            value = f"{v['value']:.2f}x"
        elif v["peer"] == "spread":
            value = f"{v['value']:.3f}x"      # 1.104 is not within 1.10
        else:
            value = f"{v['value']:.3f}"   # 3 decimals: 0.053 is not 0.05
        line = f"  {text:<{width}}  {value:>6}  {'met' if v['met'] else 'MISSED'}"
        if v["floor"] is not None:
            line += f"  (roofline floor {v['floor']:.3f})"
        if v["peer"] == "spread":
            line += f"  ({v['note']}; {v['over']} rows over"
            if v["peer_rows"]:
                line += (f"; peers: {v['peer_over']} of {v['peer_rows']} rows over, "
                         f"worst {v['peer_worst']:.3f}x")
            line += ")"
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

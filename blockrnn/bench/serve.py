"""``python -m blockrnn bench --serve``: inference as servers run it (issue 26).

Requests/s and p50/p99 latency of batch-B requests (T steps, I = H) sent by C
Python threads that share ONE model, for the LSTM and the reset-after GRU (what
ONNX Runtime's GRU with linear_before_reset=1 and nn.GRU compute):

* blockrnn: the layer's ``.inference()`` object, with default threads (each call
  takes what the thread budget has free) and with ``max_threads=1``;
* ONNX Runtime: one shared InferenceSession (``blockrnn.onnx.export`` of the same
  layer), intra-op threads 1 and default;
* PyTorch: nn.LSTM / nn.GRU with the same weights under ``torch.inference_mode``,
  torch threads 1 and default.

Each implementation runs in its own fresh process (``python -m
blockrnn.bench.serve --worker SPEC --out FILE``), one per implementation per
round; every row is a fixed duration after a warm-up, and the table shows the
median over rounds (of requests/s; of each latency percentile). Each worker also
returns its answer on a fixed request, which the parent compares with blockrnn's.

Target (issue 26): blockrnn's best >= 1.3x ONNX Runtime's best requests/s in every
row, and p99 at 2+ callers no worse than ONNX Runtime's.

Roofline: SciPy's sgemm (n^3 float32, all cores, its own process, before and after
the rounds, the better of the two) bounds the requests/s of any implementation that
does a request's products, 2*T*B*(I+H)*G*H flops (G = 4 for the LSTM, 3 for the GRU),
on this machine's cores: the ``ceiling`` column is that bound over ONNX Runtime's
best, the largest best/ORT a row can reach (a row whose ceiling is below the target
cannot meet it; a batch-1 row is bound by the weights' streaming long before).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from blockrnn.bench import peers, worker
from blockrnn.bench.worker import peer_first_command

CELLS = ("lstm", "gru")
IMPLS = ("blockrnn", "ort", "torch")
TARGET = 1.3
SETTINGS = {"blockrnn": ("default", "1 thread/caller"), "ort": ("intra-op default", "intra-op 1"),
            "torch": ("threads default", "threads 1")}


def make_layer(cell, H, seed=0):
    import blockrnn
    if cell == "lstm":
        return blockrnn.LSTM(H, H, seed=seed)
    return blockrnn.GRU(H, H, seed=seed)    # reset_after=True: nn.GRU's math


def make_input(T, B, H, seed=1):
    return np.random.default_rng(seed).standard_normal((T, B, H)).astype(np.float32)


def _build(impl, setting, cell, layer):
    """A function request(x) -> y (T, B, H) for one implementation and setting."""
    if impl == "blockrnn":
        infer = layer.inference(max_threads=1 if setting == 1 else None)
        return lambda x: infer(x)[0]
    if impl == "ort":
        import onnxruntime as ort
        from blockrnn.onnx import export
        opts = ort.SessionOptions()
        if setting == 1:
            opts.intra_op_num_threads = 1
        sess = ort.InferenceSession(export(layer).SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        return lambda x: sess.run(["Y"], {"X": x})[0][:, 0]
    import torch
    H = layer.hidden_size
    with torch.no_grad():
        if cell == "lstm":
            m = torch.nn.LSTM(H, H)
            w, b = layer.w_l0, layer.b_l0          # IFCO = nn.LSTM's i, f, g, o
            m.weight_ih_l0.copy_(torch.from_numpy(w[:H].T.copy()))
            m.weight_hh_l0.copy_(torch.from_numpy(w[H:].T.copy()))
            m.bias_ih_l0.copy_(torch.from_numpy(b))
            m.bias_hh_l0.zero_()
        else:
            m = torch.nn.GRU(H, H)
            for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
                getattr(m, name).copy_(torch.from_numpy(getattr(layer, name)))
    m.eval()

    def request(x):
        with torch.inference_mode():
            return m(torch.from_numpy(x))[0].numpy()
    return request


def serve_row(request, x, callers, duration, warmup):
    """C threads call request(x) in a loop for `duration` s (after `warmup` s of the
    same); returns requests/s and the p50/p99 latency in ms."""
    lat = [[] for _ in range(callers)]
    phase = {"measure": False, "stop": False}
    counts = [0] * callers

    def loop(i):
        while not phase["stop"]:
            t0 = time.perf_counter()
            request(x)
            t1 = time.perf_counter()
            if phase["measure"]:
                lat[i].append(t1 - t0)
                counts[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(callers)]
    for t in threads:
        t.start()
    time.sleep(warmup)
    phase["measure"] = True
    start = time.perf_counter()
    time.sleep(duration)
    phase["measure"] = False
    elapsed = time.perf_counter() - start
    phase["stop"] = True
    for t in threads:
        t.join()
    all_lat = np.array([v for part in lat for v in part]) * 1e3
    if all_lat.size == 0:
        return {"rps": 0.0, "p50_ms": float("nan"), "p99_ms": float("nan")}
    return {"rps": sum(counts) / elapsed, "p50_ms": float(np.percentile(all_lat, 50)),
            "p99_ms": float(np.percentile(all_lat, 99))}


def run_worker(spec):
    """One process: every row of one implementation."""
    impl = spec["impl"]
    out = {"pid": os.getpid(), "impl": impl, "rows": [], "answers": {}}
    if impl == "torch":
        import torch
        default_threads = torch.get_num_threads()
    for cell in spec["cells"]:
        for H in spec["hidden"]:
            layer = make_layer(cell, H)
            for s_index, setting in enumerate((None, 1)):
                if impl == "torch":
                    torch.set_num_threads(default_threads if setting is None else 1)
                request = _build(impl, setting, cell, layer)
                key = f"{cell} {H}"
                if s_index == 0:
                    out["answers"][key] = request(make_input(spec["T"], 2, H))[-1].tolist()
                for B in spec["batches"]:
                    x = make_input(spec["T"], B, H)
                    for C in spec["callers"]:
                        row = serve_row(request, x, C, spec["duration"], spec["warmup"])
                        row.update(cell=cell, H=H, B=B, callers=C, impl=impl,
                                   setting=SETTINGS[impl][s_index])
                        out["rows"].append(row)
    return out


def launch(spec, timeout=3600):
    """Run one worker process on spec; returns its output dict."""
    import blockrnn
    root = os.path.dirname(os.path.dirname(os.path.abspath(blockrnn.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "")
                                                  .split(os.pathsep) if p])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.json")
        command = peer_first_command("blockrnn.bench.serve", spec["impl"],
                                     ["--worker", json.dumps(spec), "--out", path])
        proc = subprocess.run(command, env=env, capture_output=True, text=True,
                              timeout=timeout)
        if proc.returncode != 0 or not os.path.exists(path):
            raise RuntimeError(f"serve worker {spec['impl']} failed "
                               f"(status {proc.returncode}): {proc.stderr[-2000:]}")
        with open(path) as f:
            return json.load(f)


def summarize(workers):
    """Median over rounds per (cell, H, B, callers, impl, setting)."""
    groups = {}
    for w in workers:
        for r in w["rows"]:
            key = (r["cell"], r["H"], r["B"], r["callers"], r["impl"], r["setting"])
            groups.setdefault(key, []).append(r)
    rows = []
    for key, rs in groups.items():
        cell, H, B, C, impl, setting = key
        rows.append(dict(cell=cell, H=H, B=B, callers=C, impl=impl, setting=setting,
                         rps=statistics.median(r["rps"] for r in rs),
                         p50_ms=statistics.median(r["p50_ms"] for r in rs),
                         p99_ms=statistics.median(r["p99_ms"] for r in rs), rounds=len(rs)))
    return rows


def request_flops(cell, T, B, H):
    """The matmul flops of one request (I = H): 2*T*B*(I+H)*G*H."""
    return peers.flops(f"{cell}_infer", T, B, H, H)


def sgemm_gflops(n):
    """SciPy's sgemm n^3 float32 on all cores in a fresh process (bench's worker),
    best of 3, in GFLOP/s; None if it failed."""
    try:
        return worker.sgemm_roofline({"reps": 3}, n)["gflops"]
    except Exception as exc:  # noqa: BLE001 - the table is printed without a ceiling
        print(f"WARNING: sgemm roofline failed: {exc}")
        return None


def verdicts(rows, T=None, gflops=None):
    """Per (cell, H, B, callers): blockrnn's best / ORT's best requests/s, the p99s
    of those best settings, whether the row meets the target, and the ceiling of
    that ratio at `gflops` (the sgemm roofline; None without it) for requests of T
    steps."""
    out = []
    keys = sorted({(r["cell"], r["H"], r["B"], r["callers"]) for r in rows})
    for key in keys:
        best = {}
        for impl in ("blockrnn", "ort"):
            cand = [r for r in rows if (r["cell"], r["H"], r["B"], r["callers"]) == key
                    and r["impl"] == impl]
            if cand:
                best[impl] = max(cand, key=lambda r: r["rps"])
        if len(best) < 2:
            continue
        ratio = best["blockrnn"]["rps"] / best["ort"]["rps"] if best["ort"]["rps"] else None
        p99_ok = key[3] < 2 or best["blockrnn"]["p99_ms"] <= best["ort"]["p99_ms"]
        ceiling = None
        if gflops and T and best["ort"]["rps"]:
            cell, H, B, _ = key
            ceiling = gflops * 1e9 / request_flops(cell, T, B, H) / best["ort"]["rps"]
        out.append(dict(zip(("cell", "H", "B", "callers"), key), ratio=ratio, ceiling=ceiling,
                        blockrnn_p99_ms=best["blockrnn"]["p99_ms"],
                        ort_p99_ms=best["ort"]["p99_ms"],
                        met=ratio is not None and ratio >= TARGET and p99_ok))
    return out


def print_tables(rows, checks, file=None):
    file = sys.stdout if file is None else file
    print(f"\n{'cell':<5}{'H':>5}{'B':>3}{'callers':>8}  {'implementation':<30}"
          f"{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}", file=file)
    for r in sorted(rows, key=lambda r: (r["cell"], r["H"], r["B"], r["callers"],
                                         IMPLS.index(r["impl"]), r["setting"])):
        print(f"{r['cell']:<5}{r['H']:>5}{r['B']:>3}{r['callers']:>8}  "
              f"{r['impl'] + ' ' + r['setting']:<30}{r['rps']:>9.0f}{r['p50_ms']:>9.3f}"
              f"{r['p99_ms']:>9.3f}", file=file)
    print(f"\ntarget: blockrnn's best >= {TARGET}x ONNX Runtime's best req/s in every row, "
          f"p99 at 2+ callers no worse", file=file)
    print(f"{'cell':<5}{'H':>5}{'B':>3}{'callers':>8}{'best/ORT':>10}{'ceiling':>9}"
          f"{'p99 ours':>10}{'p99 ORT':>10}  verdict", file=file)
    for c in checks:
        ratio = "n/a" if c["ratio"] is None else f"{c['ratio']:.2f}x"
        ceiling = "n/a" if c.get("ceiling") is None else f"{c['ceiling']:.2f}x"
        print(f"{c['cell']:<5}{c['H']:>5}{c['B']:>3}{c['callers']:>8}{ratio:>10}{ceiling:>9}"
              f"{c['blockrnn_p99_ms']:>10.3f}{c['ort_p99_ms']:>10.3f}  "
              f"{'met' if c['met'] else 'NOT met'}", file=file)
    met = sum(c["met"] for c in checks)
    beyond = sum(c.get("ceiling") is not None and c["ceiling"] < TARGET for c in checks)
    print(f"{met} of {len(checks)} rows met; {beyond} with a ceiling below {TARGET}x "
          f"(ceiling: best/ORT if blockrnn ran a request's flops at the sgemm roofline)",
          file=file)


def add_arguments(parser):
    g = parser.add_argument_group("--serve (inference throughput and latency)")
    g.add_argument("--serve", action="store_true",
                   help="measure requests/s and p50/p99 latency of shared-model inference "
                        "(LSTM and reset-after GRU) against ONNX Runtime and PyTorch")
    g.add_argument("--serve-hidden", type=int, nargs="+", default=[128, 256], metavar="H")
    g.add_argument("--serve-steps", type=int, default=64, metavar="T")
    g.add_argument("--serve-batches", type=int, nargs="+", default=[1, 8], metavar="B")
    g.add_argument("--serve-callers", type=int, nargs="+", default=None, metavar="C",
                   help="calling threads (default: 1 and 2, up to the core count)")
    g.add_argument("--serve-duration", type=float, default=1.5, metavar="S")
    g.add_argument("--serve-warmup", type=float, default=0.3, metavar="S")
    g.add_argument("--serve-rounds", type=int, default=3)
    g.add_argument("--serve-impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    g.add_argument("--serve-cells", nargs="+", choices=CELLS, default=list(CELLS))


def main_serve(opts):
    """Run the serve benchmark from parsed options; returns the exit status."""
    callers = opts.serve_callers or sorted({1, min(2, os.cpu_count() or 1)})
    spec = dict(cells=opts.serve_cells, hidden=opts.serve_hidden, T=opts.serve_steps,
                batches=opts.serve_batches, callers=callers, duration=opts.serve_duration,
                warmup=opts.serve_warmup)
    n = getattr(opts, "sgemm_size", 2048)
    gflops = [sgemm_gflops(n)]
    workers = []
    for _ in range(opts.serve_rounds):
        for impl in opts.serve_impls:   # each implementation in a fresh process
            workers.append(launch(dict(spec, impl=impl)))
    # parity: every implementation's answer on the fixed request vs blockrnn's
    ref = next((w["answers"] for w in workers if w["impl"] == "blockrnn"), None)
    for w in workers:
        for key, ans in w["answers"].items():
            if ref is not None and key in ref:
                err = float(np.max(np.abs(np.array(ans) - np.array(ref[key]))))
                if err > 1e-4:
                    print(f"WARNING: {w['impl']} {key}: |y - blockrnn's y| = {err:.2e}")
    gflops.append(sgemm_gflops(n))
    peak = max((g for g in gflops if g), default=None)
    rows = summarize(workers)
    checks = verdicts(rows, opts.serve_steps, peak)
    print(f"blockrnn bench --serve: T={opts.serve_steps}, I=H, float32, "
          f"{opts.serve_duration} s per row after {opts.serve_warmup} s warm-up, "
          f"median of {opts.serve_rounds} rounds, each implementation in its own process")
    print("sgemm roofline (all cores): scipy.linalg.blas.sgemm " + f"{n}^3 float32, own "
          "process, before / after the rounds: " + " / ".join(
              "failed" if g is None else f"{g:.1f}" for g in gflops) + " GFLOP/s")
    print_tables(rows, checks)
    print("\nworker pids: " + ", ".join(f"{w['impl']}={w['pid']}" for w in workers))
    if getattr(opts, "json", None):
        with open(opts.json, "w") as f:
            json.dump({"rows": rows, "checks": checks, "workers": workers,
                       "sgemm": {"n": n, "gflops": gflops}}, f, indent=1)
    return 0


def _worker_main(argv):
    p = argparse.ArgumentParser(prog="python -m blockrnn.bench.serve")
    p.add_argument("--worker", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    out = run_worker(json.loads(a.worker))
    with open(a.out, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))

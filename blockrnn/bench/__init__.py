"""Benchmark harness of blockrnn against its peers, shipped in the wheel.

* ``blockrnn.bench.run`` -- ``python -m blockrnn bench`` (which calls
  ``blockrnn.bench.run.main(argv)``; the peers come with ``pip install blockrnn[bench]``):
  the timing tables of blockrnn vs TensorFlow raw ops, PyTorch, ONNX Runtime and JAX, on
  all cores and on one core, each implementation in its own process, with parity checks,
  GFLOP/s, share of the sgemm roofline, peak memory, the scaling table and the targets.
  ``--threads`` switches to the thread-scaling mode.
* ``blockrnn.bench.worker`` -- the fresh process that times one implementation per round
  (``python -m blockrnn.bench.worker --spec JSON --out FILE``), and its launcher.
* ``blockrnn.bench.threads`` -- thread scaling of batch-1 sequence inference from 1, 2, 4 Python
  threads (``python -m blockrnn.bench.threads``, or ``python -m blockrnn bench --threads``).
* ``blockrnn.bench.peers`` -- the problems, and one callable per implementation and workload,
  each with its parity check.
* ``blockrnn.bench.measure`` -- cell-loop calibration, peak-memory probes, the sgemm roofline, the
  environment header.
"""

"""Benchmark harness of blockrnn against its peers (GitHub issue 3).

* ``benchmarks.run`` -- ``python -m benchmarks.run`` (and ``python -m blockrnn bench``, which
  calls ``benchmarks.run.main(argv)``): the timing table of blockrnn vs TensorFlow raw ops,
  PyTorch and ONNX Runtime, with parity checks, GFLOP/s, share of the sgemm roofline and
  peak memory. ``--threads`` switches to the thread-scaling mode.
* ``benchmarks.threads`` -- thread scaling of batch-1 sequence inference from 1, 2, 4 Python
  threads (``python -m benchmarks.threads``, or ``python -m benchmarks.run --threads``).
* ``benchmarks.peers`` -- the problems, and one callable per implementation and workload,
  each with its parity check.
* ``benchmarks.measure`` -- round-robin timing, peak-memory probes, the sgemm roofline, the
  environment header.
"""

"""Profiling tools: they explain a benchmark's number rather than produce one.

Run from the repository root as ``python -m benchmarks.profiling.<name>``:

- ``compare_exports``: several exports decode the same batches interleaved in one
  process; is a change faster, and are its ids the same?
- ``step_breakdown``: where a decoding step's CPU time goes, ours against CTranslate2
  (Linux ``perf`` and oneDNN's log of every call).
- ``profile_ops``: the op types with the most self time under TensorFlow's profiler.
"""

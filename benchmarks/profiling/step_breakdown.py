"""Where a decoding step's CPU time goes, ours against CTranslate2 (a tool, not a test).

    pip install -e '.[bench]'     # ctranslate2, transformers, torch (CPU), tokenizers
    python -m benchmarks.profiling.step_breakdown --size small        # needs Linux perf

TensorBoard's profiler charges the time of small ops to their neighbours
(docs/benchmarks.md), so this measures two other ways. Each runs on a child process
that decodes the workload of ``benchmarks.peers`` (its flags: ``--batch`` sentences of
newstest2013, split into ``--batch_parts`` equal parts, beam ``--beam``, every output forced to
``--output_tokens`` tokens, random weights) for ``--seconds``:

- Linux ``perf`` samples the child with frame-pointer call chains. oneDNN names its
  JIT kernels for perf (``ONEDNN_JIT_PROFILE=2``). A sample counts towards the
  TensorFlow op kernel on its stack. JIT frames carry no frame pointers, so a
  product's kernel time counts as "oneDNN sgemm kernels (op unknown)".
  CTranslate2's samples count by their leaf function.
- ``ONEDNN_VERBOSE=1`` logs every oneDNN call the child makes, its shape and time
  (both libraries multiply through oneDNN's sgemm on CPU). The calls' time is given
  per step of one stream, by shape and by number of rows.

The last line is one JSON object.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import tensorflow as tf
from absl import app, flags

from benchmarks import peers
from benchmarks.common import machine
from benchmarks.peers import workload  # the workload's flags: --size, --batch, --batch_parts, --threads, ...

FLAGS = flags.FLAGS
flags.adopt_module_key_flags(workload)  # --help lists them too
flags.DEFINE_integer("seconds", 20, "Seconds each child decodes (and perf samples) after its warm-up.", lower_bound=2)
flags.DEFINE_integer("perf_frequency", 999, "perf samples per second.", lower_bound=1)
flags.DEFINE_integer("top", 15, "Rows of each table.", lower_bound=1)
flags.DEFINE_enum("child_system", None, ["ours", "ct2"], "Internal: run as the decoding child of this system.")
flags.DEFINE_string("child_model", None, "Internal: the child's SavedModel or CTranslate2 model directory.")
flags.DEFINE_string("child_batches", None, "Internal: .npz of the child's source batches.")

READY, DONE = "STEP_BREAKDOWN_READY", "STEP_BREAKDOWN_DONE "
_ALLOCATION = {"malloc", "free", "cfree", "_int_malloc", "_int_free", "unlink_chunk.constprop.0", "malloc_consolidate"}


# --- the child: decode until --seconds are up ------------------------------------------------------


def run_child() -> None:
    with np.load(FLAGS.child_batches) as data:
        batches = [data[str(i)] for i in range(len(data.files))]
    workload.set_threads()
    run = peers.saved_decoder(FLAGS.child_system).load_decoder(FLAGS.child_model, batches)  # one batch, in parts
    run(0)  # tracing, kernel creation
    print(READY, flush=True)
    done, sentences, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < FLAGS.seconds + 2:  # outlasts perf's window
        i = done % len(batches)
        run(i)
        sentences += len(batches[i])
        done += 1
    summary = {"seconds": time.perf_counter() - start, "batches": done, "sentences": sentences}
    print(DONE + json.dumps(summary), flush=True)


# --- the parent: start children, sample them, summarise ---------------------------------------------


def _start_child(system: str, model: str, batches_file: str, flagfile: str, env: dict) -> subprocess.Popen:
    # This module again, found as the parent found it (the working directory or PYTHONPATH, inherited).
    command = [sys.executable, "-m", "benchmarks.profiling.step_breakdown", f"--flagfile={flagfile}"]
    command += [f"--child_system={system}", f"--child_model={model}", f"--child_batches={batches_file}"]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env={**os.environ, **env})
    for line in child.stdout:
        if line.startswith(READY):
            return child
    raise RuntimeError(f"{system}: the decoding child exited before it was ready (exit status {child.wait()})")


def _finish_child(child: subprocess.Popen, lines: list[str] | None = None) -> dict:
    summary = None
    for line in child.stdout:
        if line.startswith(DONE):
            summary = json.loads(line[len(DONE) :])
        elif lines is not None and summary is None:
            lines.append(line)
    if child.wait() != 0 or summary is None:
        raise RuntimeError(f"the decoding child failed (exit status {child.returncode})")
    return summary


def plain_symbol(symbol: str) -> str:
    """A C++ symbol without template arguments, parameters or namespaces TensorFlow adds to every name."""
    symbol = symbol.replace("(anonymous namespace)::", "")
    out, depth = [], 0
    for char in symbol.split("(")[0]:
        if char == "<":
            depth += 1
        elif char == ">":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(char)
    return "".join(out).replace("tensorflow::", "").removesuffix("::Compute")


def sample_category(frames: list[str]) -> str:
    """What one perf sample (its symbols, leaf first) was doing: a TensorFlow op kernel, or its leaf function."""
    for i in range(1, len(frames)):
        if "ThreadPoolDevice::Compute" in frames[i]:
            return "op " + plain_symbol(frames[i - 1])
    leaf = plain_symbol(frames[0]) if frames else "?"
    if leaf.startswith("jit_") or leaf.startswith("[unknown]"):
        return "oneDNN sgemm kernels (op unknown)" if "gemm" in leaf or "gemv" in leaf else "oneDNN JIT, other"
    if leaf in _ALLOCATION or "memalign" in leaf:
        return "malloc / free"
    if "memmove" in leaf or "memcpy" in leaf or "memset" in leaf:
        return "memmove / memcpy / memset"
    if any(part in leaf for part in ("Executor", "Propagator", "ThreadPool", "tsl::")):
        return "executor and thread pool"
    return leaf[:80]


def perf_shares(data: str) -> dict:
    """Percent of ``perf record`` samples in ``data`` by :func:`sample_category`, largest first."""
    script = subprocess.run(
        ["perf", "script", "-i", data, "-F", "ip,sym"], capture_output=True, text=True, check=True
    ).stdout
    counts = collections.Counter()
    for block in script.split("\n\n"):
        frames = [line.strip().split(None, 1)[-1] for line in block.strip().splitlines() if line.strip()]
        if frames:
            counts[sample_category(frames)] += 1
    total = sum(counts.values()) or 1
    return {name: round(100 * n / total, 2) for name, n in counts.most_common()}


def onednn_calls(lines: list[str], stream_steps: int) -> dict:
    """oneDNN's verbose ``exec`` lines summed per stream step: in all, by rows of the product and by call."""
    calls = collections.defaultdict(lambda: [0, 0.0])  # (primitive, shape) -> [calls, ms]
    for line in lines:
        fields = line.strip().split(",")
        if not fields[0].startswith("onednn_verbose") or "exec" not in fields or "cpu" not in fields:
            continue
        kind = fields[fields.index("cpu") + 1]
        entry = calls[(kind, fields[-2])]
        entry[0] += 1
        entry[1] += float(fields[-1])
    by_rows = collections.Counter()
    for (kind, shape), (_, ms) in calls.items():
        rows = shape.split("x")[0]
        by_rows[f"{kind} {rows} rows" if rows.isdigit() else kind] += ms
    top = sorted(calls.items(), key=lambda item: -item[1][1])[: FLAGS.top]
    return {
        "total": round(sum(ms for _, ms in calls.values()) / stream_steps, 3),
        "by_rows": {k: round(v / stream_steps, 3) for k, v in by_rows.most_common(FLAGS.top)},
        "top_calls": [
            {
                "call": f"{kind} {shape}",
                "ms_per_step": round(ms / stream_steps, 3),
                "calls_per_step": round(n / stream_steps, 2),
                "us_per_call": round(1000 * ms / n, 2),
            }
            for (kind, shape), (n, ms) in top
        ],
    }


def measure(system: str, model: str, batches_file: str, flagfile: str, work: str) -> dict:
    """One child sampled by perf, then one child logged by oneDNN: the system's row of the result."""
    data = os.path.join(work, f"{system}.perf.data")
    child = _start_child(system, model, batches_file, flagfile, {"ONEDNN_JIT_PROFILE": "2"})
    try:
        record = subprocess.run(
            ["perf", "record", "-q", "-F", str(FLAGS.perf_frequency), "--call-graph=fp", "-p", str(child.pid)]
            + ["-o", data, "--", "sleep", str(FLAGS.seconds)],
            capture_output=True,
            text=True,
        )
        if record.returncode != 0:
            raise RuntimeError(f"perf record failed (kernel.perf_event_paranoid?): {record.stderr.strip()}")
        summary = _finish_child(child)
        shares = perf_shares(data)
    finally:
        child.kill()
        if os.path.exists(f"/tmp/perf-{child.pid}.map"):
            os.remove(f"/tmp/perf-{child.pid}.map")
    tokens = summary["sentences"] * FLAGS.output_tokens
    result = {
        "target_tokens_per_second": round(tokens / summary["seconds"], 1),
        "ms_per_step": round(1000 * summary["seconds"] / (summary["batches"] * FLAGS.output_tokens), 2),
        "cpu_share_percent": dict(list(shares.items())[: FLAGS.top]),
    }
    lines: list[str] = []
    child = _start_child(system, model, batches_file, flagfile, {"ONEDNN_VERBOSE": "1"})
    try:
        summary = _finish_child(child, lines)
    finally:
        child.kill()
    result["onednn_ms_per_step"] = onednn_calls(lines, summary["batches"] * FLAGS.batch_parts * FLAGS.output_tokens)
    return result


def _print_table(system: str, result: dict) -> None:
    print(f"\n{system}: {result['target_tokens_per_second']} target tok/s, {result['ms_per_step']} ms a step")
    for name, share in result["cpu_share_percent"].items():
        print(f"  {share:6.2f} %  {name}")
    calls = result["onednn_ms_per_step"]
    print(f"  oneDNN calls: {calls['total']} ms a stream step")
    for call in calls["top_calls"]:
        per_call = f"{call['calls_per_step']:7.1f} × {call['us_per_call']:8.1f} µs"
        print(f"    {call['ms_per_step']:7.3f} ms  {per_call}  {call['call']}")


def main(argv):
    del argv
    if FLAGS.child_system:
        run_child()
        return
    if len(FLAGS.size) != 1:
        raise app.UsageError("give one --size")
    unknown = set(FLAGS.systems) - set(peers.SAVED_DECODERS)
    if unknown:
        raise app.UsageError(f"--systems: only ours and ct2 can be broken down, not {sorted(unknown)}")
    if not shutil.which("perf"):
        raise app.UsageError("Linux perf is not installed (the perf or linux-tools package)")
    if not os.path.exists(FLAGS.data):
        raise app.UsageError(f"--data {FLAGS.data}: not found (real corpora live in ../shared/data)")
    if FLAGS.threads % FLAGS.batch_parts:
        raise app.UsageError(f"--threads {FLAGS.threads} must be a multiple of --batch_parts {FLAGS.batch_parts}")
    if FLAGS.workers != 1:
        raise app.UsageError("--workers: this tool breaks down one batch at a time (in --batch_parts)")
    size = FLAGS.size[0]
    results = {}
    with tempfile.TemporaryDirectory() as work:
        decoding = workload.decoding_workload(work)
        batches_file = os.path.join(work, "batches.npz")
        np.savez(batches_file, **{str(i): batch for i, batch in enumerate(decoding.batches)})
        flagfile = os.path.join(work, "flags.txt")
        FLAGS.append_flags_into_file(flagfile)
        models = {
            system: peers.saved_decoder(system).save_decoder(size, decoding)
            for system in peers.SAVED_DECODERS
            if system in FLAGS.systems
        }
        for system, model in models.items():
            results[system] = measure(system, model, batches_file, flagfile, work)
            _print_table(system, results[system])
    settings = ("size", "batch", "beam", "output_tokens", "batch_parts", "threads", "seconds")
    print(
        json.dumps(
            {
                "benchmark": "step_breakdown",
                **{key: FLAGS[key].value for key in settings},
                "systems": results,
                "machine": machine(),
                "tensorflow": tf.__version__,
            }
        )
    )


if __name__ == "__main__":
    FLAGS.set_default("size", ["small"])
    FLAGS.set_default("systems", ["ours", "ct2"])
    FLAGS.set_default("batch_parts", 2)
    app.run(main)

"""The ops a decoding step of an export executes, by kind, and what each kind costs (a diagnostic).

    python -m benchmarks.profiling.step_ops --model_dir runs/multi30k_en_de \
        --checkpoint runs/multi30k_en_de/averaged/ckpt --rows 32,1

The run's checkpoint is exported with every output forced to ``--fixed_length`` tokens
(equal work whatever the model learned; ``--precision`` as ``tft-export`` takes it) and
loaded as TF Serving loads it: the session-based loader, control flow lowered to
``Switch``/``Merge`` frames, TensorFlow's CPU graph rewrites (oneDNN's ops) applied. For
each ``--rows`` (the first sentences of ``--src``) it times the batch untraced, then runs it
once with a full trace (``RunMetadata`` step stats) and counts every op the search loop
executed (nodes named ``…/while/…``), per loop iteration, by op type and by kind
(:data:`KINDS`). A trace's per-op times include the tracer's own cost, which inflates small
ops: read them as shares, the untraced time as the cost. The last line is one JSON object.
"""

from __future__ import annotations

import collections
import json
import os
import time

from absl import app, flags

from benchmarks import skipped_without, start_tensorflow

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Run directory (tft-train output); only read.")
flags.DEFINE_string("checkpoint", None, "Checkpoint prefix (default: the run's newest checkpoint).")
flags.DEFINE_string("work", "/tmp/step_ops", "Where the export is written (replaced).")
flags.DEFINE_string("src", "../shared/data/multi30k/test_2016_flickr.en", "Source sentences, one per line.")
flags.DEFINE_list("rows", ["32", "1"], "Batch sizes (sentences) to trace.")
flags.DEFINE_integer("fixed_length", 24, "Output tokens of every sentence.", lower_bound=2)
flags.DEFINE_integer("beam_size", None, "Beam size (default: the run's).", lower_bound=1)
flags.DEFINE_enum("precision", "float32", ["float32", "bfloat16"], "The export's weights and compute.")
flags.DEFINE_integer("threads", 2, "TensorFlow's intra- and inter-op threads.", lower_bound=1)
flags.DEFINE_integer("repeats", 10, "Untraced runs timed per batch size (the median is reported).", lower_bound=1)
flags.DEFINE_integer("top", 25, "Op types listed per batch size.", lower_bound=1)
flags.mark_flag_as_required("model_dir")

# Op types by kind; the CPU rewrites' names (``_Mkl…``) count with the op they replace. Others: "compute".
KINDS = {
    "products": ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "_MklMatMul", "_MklBatchMatMul"),
    "softmax": ("Softmax", "LogSoftmax", "_MklSoftmax", "Exp"),
    "moving data": (
        "Transpose",
        "_MklTranspose",
        "Reshape",
        "Bitcast",
        "ConcatV2",
        "Pack",
        "Slice",
        "StridedSlice",
        "Split",
        "SplitV",
        "Tile",
        "ExpandDims",
        "Squeeze",
        "Identity",
        "Snapshot",
    ),
    "gathers, scatters, in place": ("GatherV2", "GatherNd", "TensorScatterUpdate", "InplaceUpdate", "Empty", "Where"),
    "top-k": ("TopKV2",),
    "casts": ("Cast",),
    "control flow": ("Switch", "Merge", "Enter", "Exit", "NextIteration", "LoopCond", "NoOp", "_SwitchN"),
    "constants": ("Const", "HostConst"),
    "shape arithmetic": ("Shape", "ShapeN", "Size", "Rank", "Range", "Fill", "FloorDiv", "FloorMod"),
}
_KIND_OF = {op: kind for kind, ops in KINDS.items() for op in ops}


def kind_of(op: str) -> str:
    """The kind of an op type (:data:`KINDS`), "compute" for the rest (elementwise ops, reductions, norms)."""
    if op in _KIND_OF:
        return _KIND_OF[op]
    return "products" if op.startswith("_Mkl") and "MatMul" in op else "compute"


def loop_profile(step_stats) -> dict:
    """Op counts and traced microseconds of the search loop's nodes (named ``…/while/…``), per loop iteration."""
    count, micros, per_node = collections.Counter(), collections.Counter(), collections.Counter()
    for device in step_stats.dev_stats:
        for node in device.node_stats:
            if "/while/" not in f"/{node.node_name}":  # outside the loop (inside a function call or not)
                continue
            label = node.timeline_label
            op = label.split(" = ", 1)[1].split("(", 1)[0] if " = " in label else node.node_name.rsplit("/", 1)[-1]
            count[op] += 1
            micros[op] += node.all_end_rel_micros
            if "/while/body/" in f"/{node.node_name}":
                per_node[node.node_name] += 1
    iterations = max(per_node.values(), default=0)  # a node of the loop's body runs once an iteration
    if not iterations:
        return {"iterations": 0}
    kinds = collections.defaultdict(lambda: [0, 0])
    for op in count:
        kinds[kind_of(op)][0] += count[op]
        kinds[kind_of(op)][1] += micros[op]
    return {
        "iterations": iterations,
        "ops_per_step": round(sum(count.values()) / iterations, 1),
        "by_kind": {
            kind: {"ops": round(n / iterations, 1), "traced_us": round(us / iterations, 1)}
            for kind, (n, us) in sorted(kinds.items(), key=lambda item: -item[1][1])
        },
        "top_ops": [
            {"op": op, "ops": round(n / iterations, 1), "traced_us": round(micros[op] / iterations, 1)}
            for op, n in sorted(count.items(), key=lambda item: -micros[item[0]])[: FLAGS.top]
        ],
    }


def main(argv):
    del argv
    if skipped_without("step_ops", (FLAGS.src,)):
        return
    tf = start_tensorflow(FLAGS.threads)
    import numpy as np
    import tensorflow_text  # noqa: F401  (the export's ops, as its loaders must)

    from benchmarks.common import machine
    from pipelines import read_lines
    from tf_transformer.decoding.decode_options import DecodeOptions
    from tf_transformer.exporting.saved_model import export_run
    from tf_transformer.run_dir import checkpoint_dir, checkpoints

    checkpoint = FLAGS.checkpoint or checkpoints(checkpoint_dir(FLAGS.model_dir))[-1]
    length = FLAGS.fixed_length
    options = DecodeOptions.for_run(
        FLAGS.model_dir, beam_size=FLAGS.beam_size, min_length=length, max_output_length=length
    )
    export_dir = os.path.join(FLAGS.work, FLAGS.precision, "1")
    export_run(
        FLAGS.model_dir,
        export_dir,
        options,
        checkpoint,
        overwrite=True,
        alignment_layer=None,
        request_signatures=False,
        dtype=FLAGS.precision,
    )
    lines = [line.strip() for line in read_lines(FLAGS.src)]
    graph = tf.Graph()
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=FLAGS.threads, inter_op_parallelism_threads=FLAGS.threads
    )
    session = tf.compat.v1.Session(graph=graph, config=config)
    with graph.as_default():
        meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
    signature = meta_graph.signature_def["serving_default"]
    inputs = signature.inputs["inputs"].name
    output = signature.outputs["translations"].name
    results = {}
    for rows in (int(value) for value in FLAGS.rows):
        feed = {inputs: np.array(lines[:rows], dtype=object)}
        for _ in range(3):  # warm-up
            session.run(output, feed)
        seconds = []
        for _ in range(FLAGS.repeats):
            start = time.perf_counter()
            session.run(output, feed)
            seconds.append(time.perf_counter() - start)
        metadata = tf.compat.v1.RunMetadata()
        trace = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        session.run(output, feed, options=trace, run_metadata=metadata)
        profile = loop_profile(metadata.step_stats)
        results[rows] = {"ms_per_batch": round(1000 * float(np.median(seconds)), 2), **profile}
        kinds = {kind: values["ops"] for kind, values in profile.get("by_kind", {}).items()}
        print(f"{rows} rows: {results[rows]['ms_per_batch']} ms a batch, ops a step by kind {kinds}", flush=True)
    print(
        json.dumps(
            {
                "benchmark": "step_ops",
                "model_dir": FLAGS.model_dir,
                "checkpoint": checkpoint,
                "precision": FLAGS.precision,
                "beam_size": options.beam_size,
                "fixed_length": length,
                "threads": FLAGS.threads,
                "rows": results,
                "machine": machine(),
                "tensorflow": tf.__version__,
            }
        )
    )


if __name__ == "__main__":
    app.run(main)

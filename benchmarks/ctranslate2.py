"""Our SavedModel export against CTranslate2 (float32 and int8) on the same converted model (a benchmark).

    python -m benchmarks.ctranslate2 --model_dir RUN --work /tmp/ct2_bench

One checkpoint of RUN (default: its newest) is exported four ways: ``tft-export``
(a SavedModel; its ``serving_default`` is timed) with float32 weights and, where
the CPU has a bfloat16 unit, with bfloat16 ones (``--precision bfloat16``), and
``tft-export --format ctranslate2`` with float32 and with int8 weights. Each system takes strings and
returns strings (CTranslate2 through the python ``sentencepiece`` package with the
export's ``sp.model``), on ``--threads`` threads, one batch at a time. Each system runs in
a process of its own, and they take turns by whole passes, the order rotating by round
(:mod:`benchmarks.isolated`: interleaved batch by batch in one process, CTranslate2 ran at
half its speed). Two workloads:

- **test set**: ``--src`` in batches of ``--batch``, beam ``--beam_size``, our α; each
  system's sentences per second, median batch latency and sacreBLEU against ``--ref``. CTranslate2 divides
  a hypothesis's log-probability by ``length ** length_penalty`` where we divide by
  GNMT's ``((5 + length) / 6) ** α``; it gets ``length_penalty = α · L / (L + 5)``,
  with L the references' mean length in pieces with EOS (the two penalties then grow
  alike near L; docs/ctranslate2.md). ``ct2_float32_lp1`` is CTranslate2 at its default
  ``length_penalty`` 1, for BLEU. Its maximum output length is ours: source + EOS +
  the run's ``max_extra_length`` (for the batch's longest source).
- **longest sentences**: the ``--longest`` longest sources of the test set (in
  SentencePiece pieces), in batches of ``--batch``, each system's sentences per second.
- **greedy** (``--greedy_check``, untimed): the share of the test set whose greedy
  translation by CTranslate2 float32 has our greedy search's pieces.
- **fixed length** (``--fixed_length`` > 0): the first ``--fixed_sentences`` sources,
  every output forced to exactly that many tokens (our export with ``--min_length`` =
  ``--max_output_length``, CTranslate2 with ``min_decoding_length`` =
  ``max_decoding_length``): equal work whatever the model has learned.

**Host classes** (``--isa avx2,avx512_core,avx512_core_bf16,default``): the CPU cannot be
chosen, so each row caps both libraries' instructions and runs all of the above in a child
process of its own: ours with oneDNN's ``ONEDNN_MAX_CPU_ISA`` (which also decides what
``--precision auto`` and the decoding kernels' layout take: :mod:`tf_transformer.cpu`),
CTranslate2 with ``CT2_FORCE_CPU_ISA`` and MKL's ``MKL_ENABLE_INSTRUCTIONS``. Each row
records the ISA each library reports it runs (oneDNN's ``ONEDNN_VERBOSE``, CTranslate2's
``CT2_VERBOSE``); bfloat16 rows only where the ISA has bfloat16 (under ``AVX2`` oneDNN has no
bfloat16 product and aborts). A cap does not simulate another CPU's clock, caches or memory,
nor Eigen's kernels, which TensorFlow compiled for its own baseline. Rows above the CPU's
own ISA are skipped.

The corpora are ``../shared/data`` (multi30k/test_2016_flickr); without them it says so and
stops. Exports go under ``--work``; the run directory is only read. The last line is one
JSON object.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time

from absl import app, flags

from benchmarks import skipped_without, start_tensorflow

FLAGS = flags.FLAGS

# --isa rows: (oneDNN's ONEDNN_MAX_CPU_ISA, CTranslate2's CT2_FORCE_CPU_ISA, MKL_ENABLE_INSTRUCTIONS, the CPU flag
# the row needs). "default" sets nothing: the machine as it is.
ISAS = {
    "avx2": ("AVX2", "AVX2", "AVX2", "avx2"),
    "avx512_core": ("AVX512_CORE", "AVX512", "AVX512", "avx512f"),
    "avx512_core_bf16": ("AVX512_CORE_BF16", "AVX512", "AVX512", "avx512_bf16"),
    "default": (None, None, None, None),
}
flags.DEFINE_string("model_dir", None, "Run directory (tft-train output); only read.")
flags.DEFINE_string("checkpoint", None, "Checkpoint prefix (default: the run's newest checkpoint).")
flags.DEFINE_string("work", "/tmp/ctranslate2_bench", "Where the three exports are written (replaced).")
flags.DEFINE_string("src", "../shared/data/multi30k/test_2016_flickr.en", "Source sentences, one per line.")
flags.DEFINE_string("ref", "../shared/data/multi30k/test_2016_flickr.de", "Their references.")
flags.DEFINE_integer("batch", 32, "Sentences per batch.", lower_bound=1)
flags.DEFINE_integer("beam_size", 4, "Beam size of every system.", lower_bound=1)
flags.DEFINE_integer("rounds", 2, "Passes over the test set (BLEU is the first pass's; they are equal).", lower_bound=1)
flags.DEFINE_integer("threads", 2, "Threads of each system: TensorFlow's intra- and inter-op, CTranslate2's intra.")
flags.DEFINE_integer("fixed_length", 40, "Output tokens of the fixed-length workload (0: leave it out).", lower_bound=0)
flags.DEFINE_integer("fixed_sentences", 256, "Sentences of the fixed-length workload.", lower_bound=1)
flags.DEFINE_integer("longest", 256, "Sentences of the longest-sentences workload (0: leave it out).", lower_bound=0)
flags.DEFINE_enum(
    "bfloat16",
    "auto",
    ["auto", "yes", "no"],
    "Also time a bfloat16 export (auto: where the CPU has a bfloat16 unit; elsewhere it is emulated, slower).",
)
flags.DEFINE_list(
    "isa",
    [],
    f"Host classes to simulate, one child process each: {', '.join(ISAS)} (empty: this machine as it is).",
)
flags.DEFINE_string("isa_row", None, "Internal: run as the child of one --isa row (its variables already set).")
flags.DEFINE_bool(
    "greedy_check",
    True,
    "Also count the test set's greedy translations CTranslate2 float32 and our greedy search make identical (untimed).",
)
flags.mark_flag_as_required("model_dir")


def main(argv):
    del argv
    if skipped_without("ctranslate2", (FLAGS.src, FLAGS.ref)):
        return
    if FLAGS.isa:
        return isa_matrix(FLAGS.isa)
    tf = start_tensorflow(FLAGS.threads)
    import sentencepiece as spm

    from benchmarks.common import ctranslate2_length_penalty, has_bfloat16_hardware, machine
    from benchmarks.isolated import Isolated, ctranslate2_model_system, in_turn, saved_model_system
    from tf_transformer.bleu import language_of, read_test_set, score
    from tf_transformer.exporting.ctranslate2 import export_ctranslate2, import_ctranslate2
    from tf_transformer.run_dir import checkpoint_dir, checkpoints, load_run

    ctranslate2 = import_ctranslate2()
    config, _ = load_run(FLAGS.model_dir)
    checkpoint = FLAGS.checkpoint or checkpoints(checkpoint_dir(FLAGS.model_dir))[-1]
    sources, references = read_test_set(FLAGS.src, FLAGS.ref)
    alpha = config.alpha

    export_seconds = {}

    def timed_export(name, export):
        start = time.perf_counter()
        path = export()
        export_seconds[name] = round(time.perf_counter() - start, 1)
        print(f"exported {name} in {export_seconds[name]} s: {path}", flush=True)
        return path

    saved_model = timed_export("saved_model", lambda: tft_export(checkpoint, "saved_model/1"))
    bfloat16 = FLAGS.bfloat16 == "yes" or (FLAGS.bfloat16 == "auto" and has_bfloat16_hardware())
    if bfloat16:
        saved_model_bf16 = timed_export(
            "saved_model_bfloat16",
            lambda: tft_export(checkpoint, "saved_model_bfloat16/1", "--precision", "bfloat16"),
        )
    ct2 = {
        weights: timed_export(
            f"ct2_{weights}",
            lambda weights=weights: export_ctranslate2(
                FLAGS.model_dir,
                os.path.join(FLAGS.work, f"ct2_{weights}"),
                checkpoint=checkpoint,
                quantization=None if weights == "float32" else weights,
                overwrite=True,
            ),
        )
        for weights in ("float32", "int8")
    }
    sentencepiece = spm.SentencePieceProcessor(model_file=os.path.join(ct2["float32"], "sp.model"))
    mean_length, length_penalty = ctranslate2_length_penalty(alpha, sentencepiece, references)

    def ours(export_dir):
        return Isolated(functools.partial(saved_model_system, export_dir, FLAGS.threads))

    def ct2_call(weights, **options):
        return Isolated(
            functools.partial(
                ctranslate2_model_system,
                ct2[weights],
                weights,
                FLAGS.threads,
                FLAGS.beam_size,
                config.max_extra_length,
                **options,
            )
        )

    systems = {
        "ours_saved_model": ours(saved_model),
        **({"ours_saved_model_bfloat16": ours(saved_model_bf16)} if bfloat16 else {}),
        "ct2_float32": ct2_call("float32", length_penalty=length_penalty),
        "ct2_int8": ct2_call("int8", length_penalty=length_penalty),
        "ct2_float32_lp1": ct2_call("float32", length_penalty=1.0),
    }
    test_set = in_turn(systems, sources, FLAGS.batch, FLAGS.rounds)
    results = {
        "settings": {
            "beam_size": FLAGS.beam_size,
            "alpha": alpha,
            "ct2_length_penalty": length_penalty,
            "reference_mean_length": round(mean_length, 2),
            "max_extra_length": config.max_extra_length,
            "batch": FLAGS.batch,
            "rounds": FLAGS.rounds,
            "threads": FLAGS.threads,
        },
        "test_set": {},
    }
    for name, (per_second, outputs, p50) in test_set.items():
        scores = score(outputs, references, language=language_of(FLAGS.ref))
        results["test_set"][name] = {
            "sentences_per_second": per_second,
            "p50_batch_ms": p50,
            "bleu": scores["bleu"],
            "moses_bleu": scores.get("moses_bleu"),
            "length_ratio": scores["length_ratio"],
            "chrf": scores["chrf"],
            "identical_to_ours": round(
                sum(a == b for a, b in zip(outputs, test_set["ours_saved_model"][1], strict=True)) / len(outputs), 3
            ),
        }
        print(f"test set, {name}: {results['test_set'][name]}", flush=True)
    results["bleu_signature"] = scores["signature"]

    if FLAGS.longest:
        by_length = sorted(sources, key=lambda line: len(sentencepiece.encode(line)), reverse=True)
        longest = by_length[: FLAGS.longest]
        timings = in_turn(
            {n: systems[n] for n in systems if n != "ct2_float32_lp1"}, longest, FLAGS.batch, FLAGS.rounds
        )
        results["longest"] = {
            "sentences": len(longest),
            "mean_source_pieces": round(sum(len(sentencepiece.encode(line)) for line in longest) / len(longest), 2),
            "sentences_per_second": {name: per_second for name, (per_second, _, _) in timings.items()},
        }
        print(f"longest sentences: {results['longest']}", flush=True)

    for system in systems.values():
        system.close()

    if FLAGS.greedy_check:
        results["greedy_identical"] = greedy_identical(
            checkpoint,
            ctranslate2.Translator(ct2["float32"], device="cpu", intra_threads=FLAGS.threads, inter_threads=1),
            sentencepiece,
            sources,
            config.max_extra_length,
        )
        print(f"greedy: {results['greedy_identical']} of the test set identical", flush=True)

    if FLAGS.fixed_length:
        length = FLAGS.fixed_length
        fixed_model = timed_export(
            "saved_model_fixed",
            lambda: tft_export(
                checkpoint, "saved_model_fixed/1", "--min_length", length, "--max_output_length", length
            ),
        )
        fixed = {
            "ours_saved_model": ours(fixed_model),
            "ct2_float32": ct2_call("float32", min_decoding_length=length, max_decoding_length=length),
            "ct2_int8": ct2_call("int8", min_decoding_length=length, max_decoding_length=length),
        }
        timings = in_turn(fixed, sources[: FLAGS.fixed_sentences], FLAGS.batch, FLAGS.rounds)
        for system in fixed.values():
            system.close()
        results["fixed_length"] = {
            "tokens": length,
            "sentences": min(FLAGS.fixed_sentences, len(sources)),
            "sentences_per_second": {name: per_second for name, (per_second, _, _) in timings.items()},
        }
        print(f"fixed length: {results['fixed_length']}", flush=True)

    results["isa"] = {"row": FLAGS.isa_row, "onednn": onednn_isa(), "ctranslate2": ct2_isa(ct2["float32"])}
    print(f"ISA: {results['isa']}", flush=True)
    results["export_seconds"] = export_seconds
    results["model_bin_megabytes"] = {
        weights: round(os.path.getsize(os.path.join(path, "model.bin")) / 2**20, 1) for weights, path in ct2.items()
    }
    print(
        json.dumps(
            {
                "benchmark": "ctranslate2",
                "model_dir": FLAGS.model_dir,
                "checkpoint": checkpoint,
                "src": FLAGS.src,
                "sentences": len(sources),
                **results,
                "machine": machine(),
                "tensorflow": tf.__version__,
                "ctranslate2": ctranslate2.__version__,
            }
        )
    )


def isa_matrix(rows: list[str]) -> None:
    """Runs this benchmark once per ``--isa`` row in a child process with the row's variables; prints the matrix."""
    from tf_transformer.cpu import cpu_info

    unknown = [row for row in rows if row not in ISAS]
    if unknown:
        sys.exit(f"--isa {','.join(unknown)}: not a host class; choose from {', '.join(ISAS)}")
    flags_of_cpu = cpu_info()[1]
    matrix = {}
    for row in rows:
        onednn, ct2, mkl, needs = ISAS[row]
        if needs and needs not in flags_of_cpu:
            matrix[row] = {"skipped": f"this CPU has no {needs}"}
            print(f"--isa {row}: skipped, this CPU has no {needs}", flush=True)
            continue
        env = dict(os.environ)
        variables = {"ONEDNN_MAX_CPU_ISA": onednn, "CT2_FORCE_CPU_ISA": ct2, "MKL_ENABLE_INSTRUCTIONS": mkl}
        for name, value in variables.items():
            env.pop(name, None)
            if value:
                env[name] = value
        argv = without_flags(sys.argv[1:], ("isa", "work"))
        command = [sys.executable, "-m", "benchmarks.ctranslate2", *argv, f"--isa_row={row}"]
        command += [f"--work={os.path.join(FLAGS.work, row)}"]
        print(f"--isa {row}: {' '.join(command)}", flush=True)
        child = subprocess.run(command, env=env, capture_output=True, text=True)
        lines = child.stdout.strip().splitlines()
        if child.returncode or not lines:
            sys.exit(f"--isa {row} failed (exit {child.returncode}):\n{child.stderr[-3000:]}")
        matrix[row] = json.loads(lines[-1])
        print(f"--isa {row}: {summary_row(matrix[row])}", flush=True)
    first = next(row for row in matrix.values() if "skipped" not in row)
    print(
        json.dumps(
            {
                "benchmark": "ctranslate2_isa_matrix",
                "rows": {row: result if "skipped" in result else summary_row(result) for row, result in matrix.items()},
                "results": matrix,
                "machine": first["machine"].split(", ONEDNN_MAX_CPU_ISA")[0],
            }
        )
    )


def without_flags(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """``argv`` without the flags ``names`` (``--name=value`` or ``--name value``)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.lstrip("-").split("=", 1)[0]
        if arg.startswith("-") and name in names:
            skip = "=" not in arg
            continue
        kept.append(arg)
    return kept


def summary_row(result: dict) -> dict:
    """One --isa row: each system's test-set sentences per second and ratio to CTranslate2 float32, and BLEU."""
    test_set = result["test_set"]
    peer = test_set["ct2_float32"]["sentences_per_second"]
    return {
        "isa": result["isa"],
        **{
            name: {
                "sentences_per_second": values["sentences_per_second"],
                "p50_batch_ms": values["p50_batch_ms"],
                "vs_ct2_float32": round(values["sentences_per_second"] / peer, 3),
                "bleu": values["bleu"],
            }
            for name, values in test_set.items()
        },
    }


def onednn_isa() -> str | None:
    """The ISA TensorFlow's oneDNN reports it runs with this process's variables (``ONEDNN_VERBOSE``)."""
    probe = "import tensorflow as tf; tf.linalg.matmul(tf.ones([64, 64]), tf.ones([64, 64])).numpy()"
    env = {**os.environ, "ONEDNN_VERBOSE": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    output = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True).stdout
    found = [line.split("isa:", 1)[1] for line in output.splitlines() if ",isa:" in line]
    return found[0].strip() if found else None


def ct2_isa(model_dir: str) -> str | None:
    """The ISA CTranslate2 reports it selected with this process's variables (``CT2_VERBOSE``)."""
    probe = f"import ctranslate2; ctranslate2.Translator({model_dir!r}, device='cpu')"
    env = {**os.environ, "CT2_VERBOSE": "1"}
    output = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    text = output.stdout + output.stderr
    found = [line.split("Selected ISA:", 1)[1] for line in text.splitlines() if "Selected ISA:" in line]
    return found[0].strip() if found else None


def greedy_identical(checkpoint, translator, sentencepiece, sentences, max_extra_length) -> float:
    """The share of ``sentences`` whose greedy translation by ``translator`` (CTranslate2, beam 1) has our greedy
    search's pieces, each with our maximum length (sentences batched by source length, so one limit fits all)."""
    import tensorflow as tf

    from tf_transformer.constants import EOS_ID, PAD_ID
    from tf_transformer.decoding.greedy import greedy_search
    from tf_transformer.run_dir import restore_model

    model, _ = restore_model(FLAGS.model_dir, checkpoint)
    search = tf.function(lambda ids: greedy_search(model, ids, max_extra_length=max_extra_length))
    by_length = {}
    for pieces in sentencepiece.encode(sentences, out_type=str):
        by_length.setdefault(len(pieces), []).append(pieces)
    same = 0
    for length, group in sorted(by_length.items()):
        for start in range(0, len(group), FLAGS.batch):
            batch = group[start : start + FLAGS.batch]
            ids = [[sentencepiece.piece_to_id(piece) for piece in pieces] + [EOS_ID] for pieces in batch]
            ours = search(tf.constant(ids, tf.int32)).numpy()
            theirs = translator.translate_batch(
                batch,
                beam_size=1,
                max_decoding_length=length + max_extra_length,
                suppress_sequences=[["<pad>"], ["<s>"]],
            )
            for row, result in zip(ours, theirs, strict=True):
                pieces = [sentencepiece.id_to_piece(int(i)) for i in row if i not in (PAD_ID, EOS_ID)]
                same += pieces == result.hypotheses[0]
    return round(same / len(sentences), 4)


def tft_export(checkpoint: str, name: str, *flags) -> str:
    """``tft-export`` of the run's ``checkpoint`` to ``--work/name`` (the translation signature only)."""
    output = os.path.join(FLAGS.work, name)
    command = [os.path.join(os.path.dirname(sys.executable), "tft-export"), "--model_dir", FLAGS.model_dir]
    command += ["--output", output, "--checkpoint", checkpoint, "--overwrite", "--noalignment"]
    command += ["--norequest_signatures", "--beam_size", str(FLAGS.beam_size), *(str(flag) for flag in flags)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"tft-export failed:\n{result.stderr[-3000:]}")
    return output


if __name__ == "__main__":
    app.run(main)

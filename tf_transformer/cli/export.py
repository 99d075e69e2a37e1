"""``tft-export``: write a trained run as a TF Serving SavedModel, or as a CTranslate2 model.

tft-export --model_dir runs/m30k --output saved_models/multi30k_en_de/1
tft-export --model_dir runs/m30k --output ct2_models/multi30k_en_de --format ctranslate2 --quantization int8
"""

from __future__ import annotations

import json
import sys

from absl import app, flags

from configs.decoding import SEARCH_SETTINGS
from tf_transformer.cli import run_main
from tf_transformer.cli.flag_groups import (
    constrained,
    decode_request,
    define_constrained_flag,
    define_decoding_flags,
    define_early_stop_flag,
)

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Model directory written by tft-train.", required=True)
flags.DEFINE_string(
    "output",
    None,
    "Export directory: saved_models/<name>/<version> (TF Serving's layout), or a CTranslate2 model directory.",
    required=True,
)
flags.DEFINE_enum(
    "format",
    "saved_model",
    ["saved_model", "ctranslate2"],
    "saved_model: a SavedModel for TF Serving, strings in and out. ctranslate2: a model directory for "
    "CTranslate2's translator, with the SentencePiece model (needs pip install -e '.[reference]'; "
    "docs/ctranslate2.md).",
)
flags.DEFINE_enum(
    "quantization",
    None,
    ["int8", "int8_float32", "int8_float16", "bfloat16", "float16"],
    "--format ctranslate2 only: store the weights in this type (default: float32).",
)
flags.DEFINE_string(
    "checkpoint",
    None,
    "Checkpoint prefix, or best: the best dev evaluation's (tft-train --keep_best_by) "
    "(default: MODEL_DIR/averaged/ckpt, else the newest).",
)
define_decoding_flags(SEARCH_SETTINGS[:2] + SEARCH_SETTINGS[3:], " (the export's own; a request may change it)")
flags.DEFINE_integer(
    "max_output_length", None, "Cap on the output length besides input + --max_extra_length.", lower_bound=1
)
define_early_stop_flag(" Fixed in the export.")
define_constrained_flag(" Fixed in the export.")
flags.DEFINE_enum(
    "word_tokenizer",
    None,
    ["penn", "none"],
    "How the export splits raw source text into words before its pieces: penn (a parser's default: the Penn "
    "Treebank's tokenization in the graph, docs/parsing.md#raw-text; the export adds a translate_tokens "
    "signature for text split already) or none (the text as it is; translation's only choice).",
)
flags.DEFINE_enum(
    "precision",
    None,
    ["auto", "float32", "bfloat16", "float16"],
    "Weights and compute dtype of the exported graph (default: float32). auto: bfloat16 where this CPU has a "
    "bfloat16 unit (AMX, AVX512_BF16), else float32 (the exporting machine's CPU decides, as it does for "
    "tft-train on CPUs); the export records which and why. bfloat16 decodes faster on such CPUs, with "
    "translations that differ slightly from float32's (docs/inference.md#precision-and-layout).",
)
flags.DEFINE_integer(
    "batch_parts",
    1,
    "Split each batch into this many parts decoded side by side. On CPUs, serve such an export with 1 intra-op "
    "thread and this many inter-op threads (TF Serving: --tensorflow_intra_op_parallelism=1 "
    "--tensorflow_inter_op_parallelism=N; tft-serve/tft-translate: --intra_op_threads 1 --inter_op_threads N).",
    lower_bound=1,
)
flags.DEFINE_integer(
    "max_source_length",
    None,
    "Longest source sentence the export accepts, in subwords with EOS (default: the training run's "
    "--max_train_length, "
    "the longest sentence it learned from). A longer one fails its request with an error naming the limit, "
    "unless --truncate_source. Bounds a request's memory: self-attention grows with the square of the length.",
    lower_bound=2,
)
flags.DEFINE_bool(
    "truncate_source", False, "Cut a longer source to --max_source_length (its first tokens and EOS) instead."
)
flags.DEFINE_bool(
    "ids_only",
    False,
    "Export translate_ids alone (also as serving_default): token ids in and out, no tensorflow-text op in the "
    "graph, for TF Serving builds without TF Text. Clients tokenize with the export's assets/sp.model.",
)
flags.DEFINE_integer(
    "alignment_layer",
    None,
    "Decoder layer (from 0) whose encoder-decoder attention aligns words in the translate_with_alignment "
    "signature (default: the last, which aligned best where measured: docs/attention.md).",
    lower_bound=0,
)
flags.DEFINE_bool("alignment", True, "Add the translate_with_alignment signature (--noalignment: leave it out).")
flags.DEFINE_bool(
    "request_signatures",
    True,
    "Add the signatures whose settings come with each request: translate_with_options (beam, α, n-best, "
    "lengths, target prefixes), score and sample (docs/inference.md#request-time-options). They double the "
    "export's graph and its writing time; --norequest_signatures leaves them out.",
)
flags.DEFINE_bool(
    "warmup",
    True,
    "Write assets.extra/tf_serving_warmup_requests: a request to every signature (and a long sentence and a batch "
    "to serving_default) that TF Serving and tft-serve run before serving the export, so that no client waits for "
    "a signature's first call; it lengthens each load by those calls (docs/serving.md#warmup). --nowarmup leaves "
    "it out.",
)
flags.DEFINE_bool("overwrite", False, "Replace an existing export directory.")


# The flags of one format only: given with the other format, they are refused, not ignored.
SAVED_MODEL_FLAGS = (
    "beam_size",
    "alpha",
    "max_extra_length",
    "min_length",
    "max_output_length",
    "early_stop",
    "constrained",
    "word_tokenizer",
    "precision",
    "batch_parts",
    "max_source_length",
    "truncate_source",
    "ids_only",
    "alignment_layer",
    "alignment",
    "request_signatures",
    "warmup",
)
CTRANSLATE2_FLAGS = ("quantization",)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    if FLAGS.format == "ctranslate2":
        given = [f"--{name}" for name in SAVED_MODEL_FLAGS if FLAGS[name].present]
        why = "CTranslate2 takes decoding settings per call, and --quantization for the weights (docs/ctranslate2.md)"
    else:
        given = [f"--{name}" for name in CTRANSLATE2_FLAGS if FLAGS[name].present]
        why = "it is for --format ctranslate2"
    if given:
        raise app.UsageError(f"{', '.join(given)}: not with --format {FLAGS.format}; {why}")
    if FLAGS.format == "ctranslate2":
        main_ctranslate2()
        return
    if FLAGS.alignment_layer is not None and (not FLAGS.alignment or FLAGS.ids_only):
        raise app.UsageError("--alignment_layer needs the alignment signature: not with --noalignment or --ids_only")
    from tf_transformer.decoding.decode_options import DecodeOptions
    from tf_transformer.exporting.saved_model import export_run
    from tf_transformer.files import ReadError, WriteError
    from tf_transformer.run_dir import CheckpointError, resolve_checkpoint

    try:
        checkpoint = resolve_checkpoint(FLAGS.model_dir, FLAGS.checkpoint)
        from tf_transformer.tasks import task_of_run

        task = task_of_run(FLAGS.model_dir)
        if FLAGS.word_tokenizer == "penn" and task.word_tokenizer is None:
            raise app.UsageError(f"--word_tokenizer penn is a parser's: this run's task is {task.name}")
        options = DecodeOptions.for_run(
            FLAGS.model_dir,
            constrained=constrained(task),
            word_tokenizer={None: task.word_tokenizer, "none": None}.get(FLAGS.word_tokenizer, FLAGS.word_tokenizer),
            max_output_length=FLAGS.max_output_length,
            early_stop=FLAGS.early_stop,
            batch_parts=FLAGS.batch_parts,
            max_source_length=FLAGS.max_source_length,
            truncate_source=FLAGS.truncate_source,
        ).merged(decode_request())
        path = export_run(
            FLAGS.model_dir,
            FLAGS.output,
            options,
            checkpoint=checkpoint,
            dtype=FLAGS.precision,
            ids_only=FLAGS.ids_only,
            alignment_layer=(
                None if not FLAGS.alignment else "last" if FLAGS.alignment_layer is None else FLAGS.alignment_layer
            ),
            overwrite=FLAGS.overwrite,
            request_signatures=FLAGS.request_signatures and not FLAGS.ids_only,
            warmup=FLAGS.warmup,
        )
    except (FileNotFoundError, FileExistsError, CheckpointError, WriteError, ValueError) as error:
        raise app.UsageError(str(error)) from None
    except ReadError as error:  # the checkpoint list could not be read: nothing was written
        sys.exit(f"tft-export: {error}")
    print(json.dumps({"exported": path, "checkpoint": checkpoint}))


def main_ctranslate2():
    """``--format ctranslate2``: the run's weights as a CTranslate2 model directory."""
    from tf_transformer.exporting.ctranslate2 import export_ctranslate2
    from tf_transformer.files import ReadError, WriteError
    from tf_transformer.run_dir import CheckpointError, resolve_checkpoint

    try:
        checkpoint = resolve_checkpoint(FLAGS.model_dir, FLAGS.checkpoint)
        path = export_ctranslate2(
            FLAGS.model_dir,
            FLAGS.output,
            checkpoint=checkpoint,
            quantization=FLAGS.quantization,
            overwrite=FLAGS.overwrite,
        )
    except (FileNotFoundError, FileExistsError, CheckpointError, WriteError, ValueError) as error:
        raise app.UsageError(str(error)) from None
    except (ImportError, ReadError) as error:  # ctranslate2 missing, or the checkpoint list unreadable
        sys.exit(f"tft-export: {error}")
    quantization = FLAGS.quantization or "float32"
    print(
        json.dumps({"exported": path, "checkpoint": checkpoint, "format": "ctranslate2", "quantization": quantization})
    )


def run():
    run_main(main)


if __name__ == "__main__":
    run()

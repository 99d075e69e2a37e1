"""A distilled student beside its teacher and beside CTranslate2 (a benchmark): quality and decoding speed.

    python -m benchmarks.distillation --work_dir runs/m30k_student

Reads what ``tft-distill`` left in ``--work_dir``: the teacher's export
(``teacher/1``), the student's run (``student/``, its averaged checkpoint) and
export (``student_export/1``), and ``stages.json``. The student is also converted
to CTranslate2 with float32 and int8 weights (under ``--ct2_work``). Then, each
system in a process of its own (:mod:`benchmarks.isolated`), ``--threads`` threads each,
strings in and out:

- **speed**: the test set in batches of ``--batch``, the systems taking turns by whole
  passes (the order rotating, ``--rounds`` rounds): the teacher and the student at their exports' beam size and greedy
  (``translate_with_options`` with ``beam_size`` 1), CTranslate2's student at both.
  Sentences per second, p50 batch latency, and each system's speed over the
  teacher's at the beam size.
- **quality**: sacreBLEU, the Multi30k papers' Moses-tokenized BLEU and the length
  ratio of every system on the test set (from the timed pass) and on the dev set
  (untimed).

The corpora are ``../shared/data`` (multi30k); without them it says so and stops.
The last line is one JSON object.
"""

from __future__ import annotations

import functools
import json
import os

from absl import app, flags

from benchmarks import skipped_without, start_tensorflow

FLAGS = flags.FLAGS
flags.DEFINE_string("work_dir", None, "tft-distill's --work_dir (only read).", required=True)
flags.DEFINE_string("ct2_work", "/tmp/distillation_bench", "Where the student's CTranslate2 models go (replaced).")
flags.DEFINE_string("data", "../shared/data/multi30k", "The corpus directory.")
flags.DEFINE_string("test_split", "test_2016_flickr", "The timed split.")
flags.DEFINE_string("dev_split", "val", "The dev split (scored, untimed; '' for none).")
flags.DEFINE_string("src", "en", "Source language.")
flags.DEFINE_string("tgt", "de", "Target language.")
flags.DEFINE_integer("batch", 32, "Sentences per batch.", lower_bound=1)
flags.DEFINE_integer("rounds", 2, "Timed passes over the test set.", lower_bound=1)
flags.DEFINE_integer("threads", 2, "Threads of each system: TensorFlow's intra- and inter-op, CTranslate2's intra.")


def main(argv):
    del argv

    def split_path(split: str, language: str) -> str:
        return os.path.join(FLAGS.data, f"{split}.{language}")

    splits = [FLAGS.test_split] + ([FLAGS.dev_split] if FLAGS.dev_split else [])
    corpora = [split_path(split, language) for split in splits for language in (FLAGS.src, FLAGS.tgt)]
    if skipped_without("distillation", corpora):
        return
    teacher_export = os.path.join(FLAGS.work_dir, "teacher", "1")
    student_dir = os.path.join(FLAGS.work_dir, "student")
    student_export = os.path.join(FLAGS.work_dir, "student_export", "1")
    for path in (teacher_export, student_dir, student_export):
        if not os.path.isdir(path):
            raise app.UsageError(f"No {path}: run tft-distill --work_dir {FLAGS.work_dir} to its end first")
    tf = start_tensorflow(FLAGS.threads)
    import sentencepiece as spm

    from benchmarks.common import ctranslate2_length_penalty, machine
    from benchmarks.isolated import Isolated, ctranslate2_model_system, in_turn, saved_model_system
    from tf_transformer.bleu import language_of, read_test_set, score
    from tf_transformer.decoding.request import DecodeRequest
    from tf_transformer.exporting.ctranslate2 import export_ctranslate2, import_ctranslate2
    from tf_transformer.exporting.export_info import read_export_info
    from tf_transformer.run_dir import load_run

    ctranslate2 = import_ctranslate2()
    config, _ = load_run(student_dir)
    test = read_test_set(split_path(FLAGS.test_split, FLAGS.src), split_path(FLAGS.test_split, FLAGS.tgt))
    sentencepiece = spm.SentencePieceProcessor(model_file=os.path.join(student_dir, "sp.model"))
    _, length_penalty = ctranslate2_length_penalty(config.alpha, sentencepiece, test[1])

    def ours(export: str, beam_size: int | None):
        """The export at its own settings (``serving_default``), or at ``beam_size`` (``translate_with_options``)."""
        request = None if beam_size is None else DecodeRequest(beam_size=beam_size)
        return Isolated(functools.partial(saved_model_system, export, FLAGS.threads, request))

    beam_size = read_export_info(student_export).options.beam_size
    teacher_beam = read_export_info(teacher_export).options.beam_size
    converted = {
        weights: export_ctranslate2(
            student_dir,
            os.path.join(FLAGS.ct2_work, f"student_ct2_{weights}"),
            quantization=None if weights == "float32" else weights,
            overwrite=True,
        )
        for weights in ("float32", "int8")
    }
    systems = {
        f"teacher_beam{teacher_beam}": ours(teacher_export, None),
        "teacher_greedy": ours(teacher_export, 1),
        f"student_beam{beam_size}": ours(student_export, None),
        "student_greedy": ours(student_export, 1),
    }
    for weights, path in converted.items():
        for beam, name in ((beam_size, f"beam{beam_size}"), (1, "greedy")):
            systems[f"student_ct2_{weights}_{name}"] = Isolated(
                functools.partial(
                    ctranslate2_model_system,
                    path,
                    weights,
                    FLAGS.threads,
                    beam,
                    config.max_extra_length,
                    length_penalty=length_penalty,
                )
            )

    timed = in_turn(systems, test[0], FLAGS.batch, FLAGS.rounds)
    teacher_speed = timed[f"teacher_beam{teacher_beam}"][0]
    language = language_of(split_path(FLAGS.test_split, FLAGS.tgt))
    dev = None
    if FLAGS.dev_split:
        dev = read_test_set(split_path(FLAGS.dev_split, FLAGS.src), split_path(FLAGS.dev_split, FLAGS.tgt))
    results = {}
    for name, (per_second, outputs, p50) in timed.items():
        results[name] = {
            "sentences_per_second": per_second,
            "vs_teacher": round(per_second / teacher_speed, 3),
            "p50_batch_ms": p50,
            FLAGS.test_split: quality(score(outputs, test[1], language=language)),
        }
        if dev is not None:
            batches = [dev[0][start : start + FLAGS.batch] for start in range(0, len(dev[0]), FLAGS.batch)]
            translated = systems[name].run(batches)[0]
            results[name][FLAGS.dev_split] = quality(score(translated, dev[1], language=language))
        print(f"{name}: {results[name]}", flush=True)
    for system in systems.values():
        system.close()
    stages_path = os.path.join(FLAGS.work_dir, "stages.json")
    stages = {}
    if os.path.exists(stages_path):
        with open(stages_path, encoding="utf-8") as handle:
            stages = json.load(handle)
    print(
        json.dumps(
            {
                "benchmark": "distillation",
                "work_dir": FLAGS.work_dir,
                "student": config.name,
                "settings": {
                    "batch": FLAGS.batch,
                    "rounds": FLAGS.rounds,
                    "threads": FLAGS.threads,
                    "ct2_length_penalty": length_penalty,
                },
                "systems": results,
                "stage_seconds": {name: value["seconds"] for name, value in stages.items()},
                "machine": machine(),
                "tensorflow": tf.__version__,
                "ctranslate2": ctranslate2.__version__,
            }
        )
    )


def quality(scores: dict) -> dict:
    """The scores a distillation table shows."""
    return {name: scores.get(name) for name in ("bleu", "moses_bleu", "length_ratio", "chrf")}


if __name__ == "__main__":
    app.run(main)

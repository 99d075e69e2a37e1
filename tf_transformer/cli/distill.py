"""``tft-distill``: from a trained teacher's run directory to an exported student, each stage resumable.

    tft-distill --teacher_dir runs/m30k --data ../shared/data/multi30k --work_dir runs/m30k_student \\
        --student student_6_1 --minutes 40

Sequence-level distillation (Kim & Rush, 2016): the teacher translates the
training set, and a student, with a deep encoder and a shallow decoder (Kasai
et al., 2021), trains on its translations with the teacher's vocabulary. The
stages, in ``--work_dir``:

1. ``teacher/1``: the teacher exported (``--teacher_checkpoint``, by default its
   averaged checkpoint, else its newest);
2. ``data/``: the training sources with the teacher's translations as targets
   (:mod:`tf_transformer.inference.corpus_translation`: committed a chunk at a
   time; ``--shard i/N`` runs one shard and stops, for a cluster's array of
   tasks, and a run without it translates the shards not yet done, then joins
   them), and the original dev split;
3. ``student/``: the student trained (``--with_references``: the original
   pairs mixed in), resumed from its checkpoints if stopped;
4. ``student/averaged`` and ``student_export/1``: its last checkpoints averaged, exported.

Each stage is skipped once done, so the command run again after a kill goes on
where it stopped; ``stages.json`` records what each stage took.
docs/distillation.md says what to expect.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

from absl import app, flags

from tf_transformer.cli import run_main

FLAGS = flags.FLAGS
flags.DEFINE_string("teacher_dir", None, "The teacher's training run directory.", required=True)
flags.DEFINE_string(
    "teacher_checkpoint", None, "The teacher's checkpoint prefix (default: its averaged one, else its newest)."
)
flags.DEFINE_string("data", None, "The corpus the teacher trained on ({split}.{src} / {split}.{tgt}).", required=True)
flags.DEFINE_string("work_dir", None, "Where the stages write (created).", required=True)
flags.DEFINE_string("src", "en", "Source language.")
flags.DEFINE_string("tgt", "de", "Target language.")
flags.DEFINE_string("train_split", "train", "The split the teacher translates.")
flags.DEFINE_string("dev_split", "val", "Dev split (original references), for the student's validation.")
flags.DEFINE_string("student", "student_6_1", "The student's preset (configs/transformer.py).")
flags.DEFINE_multi_string("set", [], "Overrides of the student's config, e.g. --set decoder_layers=2.")
flags.DEFINE_float("minutes", 40.0, "The student's training budget in minutes.", lower_bound=0.0)
flags.DEFINE_integer("train_steps", None, "The student's updates instead of a time budget.", lower_bound=1)
flags.DEFINE_bool("with_references", False, "Train on the original pairs too, mixed with the teacher's.")
flags.DEFINE_integer("shards", 1, "Shards the translation is cut into.", lower_bound=1)
flags.DEFINE_string("shard", None, "i/N: translate this shard only, then stop (one task of an array).")
flags.DEFINE_integer("batch_size", 64, "Sentences per translation batch.", lower_bound=1)
flags.DEFINE_integer("average", 10, "Last student checkpoints averaged (one every 100 updates).", lower_bound=1)
flags.DEFINE_string("precision", "auto", "The student's training precision.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    from tf_transformer.cli.startup import start_tensorflow

    start_tensorflow()
    from configs import get_config, parse_overrides
    from tf_transformer.inference.corpus_translation import Shard

    try:
        student = get_config(FLAGS.student, **parse_overrides(FLAGS.set))
        only = Shard.parse(FLAGS.shard) if FLAGS.shard is not None else None
    except ValueError as error:
        raise app.UsageError(str(error)) from None
    if only is not None and only.count != FLAGS.shards:
        raise app.UsageError(f"--shard {only} is one of {only.count} shards: pass --shards {only.count}")
    source = os.path.join(FLAGS.data, f"{FLAGS.train_split}.{FLAGS.src}")
    if not os.path.exists(source):
        raise app.UsageError(f"No {source}: --data holds {{split}}.{{src}} files")
    os.makedirs(FLAGS.work_dir, exist_ok=True)
    stages = Stages(os.path.join(FLAGS.work_dir, "stages.json"))
    teacher = os.path.join(FLAGS.work_dir, "teacher", "1")
    stages.run("teacher_export", lambda: export_teacher(teacher))
    data = os.path.join(FLAGS.work_dir, "data")
    if only is not None:  # one task of an array: its shard, then stop
        translate_shards(teacher, source, data, [only])
        print(f"shard {only} done; run without --shard to join the shards and go on", file=sys.stderr)
        return
    stages.run("teacher_translation", lambda: translate_training_set(teacher, source, data))
    student_dir = os.path.join(FLAGS.work_dir, "student")
    stages.run("student_training", lambda: train_student(student, teacher, data, student_dir))
    export = os.path.join(FLAGS.work_dir, "student_export", "1")
    stages.run("student_export", lambda: export_student(student_dir, export))
    print(json.dumps({"student_export": export, "stages": stages.seconds()}))


class Stages:
    """Which stages are done and what each took, in ``stages.json``: a done stage is not run again."""

    def __init__(self, path: str):
        self.path = path
        self.done = {}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                self.done = json.load(handle)

    def run(self, name: str, stage) -> None:
        if name in self.done:
            print(f"{name}: done ({self.done[name]['seconds']:.0f} s)", file=sys.stderr, flush=True)
            return
        print(f"{name} …", file=sys.stderr, flush=True)
        started = time.perf_counter()
        stage()
        self.done[name] = {"seconds": round(time.perf_counter() - started, 1)}
        from tf_transformer.files import save_json

        save_json(self.path, self.done)
        print(f"{name}: {self.done[name]['seconds']:.0f} s", file=sys.stderr, flush=True)

    def seconds(self) -> dict:
        return {name: value["seconds"] for name, value in self.done.items()}


def export_teacher(output: str) -> None:
    from tf_transformer.exporting.saved_model import export_run

    export_run(FLAGS.teacher_dir, output, checkpoint=FLAGS.teacher_checkpoint, overwrite=True)


def translate_shards(teacher: str, source: str, data: str, shards) -> None:
    """The ``shards`` of the training set translated into ``data/{train}.{tgt}``'s shard files (resumed)."""
    from tf_transformer.exporting.export_info import SourceLimit
    from tf_transformer.inference.batch_translation import export_translate
    from tf_transformer.inference.corpus_translation import progress_line, translate_shard

    os.makedirs(data, exist_ok=True)
    translate = export_translate(teacher)
    limits = SourceLimit(teacher)
    settings = {"model": os.path.abspath(teacher), "batch_size": FLAGS.batch_size}
    output = os.path.join(data, f"{FLAGS.train_split}.{FLAGS.tgt}")
    for shard in shards:

        def report(done, lines, rate, shard=shard):
            print(f"\r{progress_line(shard, done, lines, rate)}", end="", file=sys.stderr, flush=True)

        done = translate_shard(
            translate,
            source,
            output,
            shard,
            settings,
            too_long=lambda line: limits.violation(line) is not None,
            report=report,
        )
        print(f"\n{done.summary()}; training drops empty translations", file=sys.stderr)


def translate_training_set(teacher: str, source: str, data: str) -> None:
    """Every shard translated (those done are skipped), joined; the sources and the dev split beside them."""
    from tf_transformer.inference.corpus_translation import Shard, join_shards

    translate_shards(teacher, source, data, [Shard(i, FLAGS.shards) for i in range(FLAGS.shards)])
    join_shards(os.path.join(data, f"{FLAGS.train_split}.{FLAGS.tgt}"), FLAGS.shards)
    copies = [(source, os.path.join(data, os.path.basename(source)))]
    if FLAGS.dev_split:
        for language in (FLAGS.src, FLAGS.tgt):
            name = f"{FLAGS.dev_split}.{language}"
            copies.append((os.path.join(FLAGS.data, name), os.path.join(data, name)))
    from tf_transformer.files import sync_path

    for original, copy in copies:  # on the disk before they are in place: the stage is then recorded done
        staging = f"{copy}.partial"
        shutil.copyfile(original, staging)
        sync_path(staging)
        os.replace(staging, copy)
    sync_path(data)


def train_student(config, teacher: str, data: str, student_dir: str) -> None:
    """The student trained on ``data`` (and the original pairs with ``--with_references``), the teacher's
    SentencePiece model reused."""
    from configs import RunOptions
    from tf_transformer.files import copy_file
    from tf_transformer.training.trainer import train

    os.makedirs(student_dir, exist_ok=True)
    vocabulary = os.path.join(student_dir, "sp.model")
    if not os.path.exists(vocabulary):  # copied whole or not at all: the next run trusts one that exists
        copy_file(os.path.join(teacher, "assets", "sp.model"), vocabulary)
    corpora = (data, FLAGS.data) if FLAGS.with_references else data
    options = RunOptions(
        data=corpora,
        src=FLAGS.src,
        tgt=FLAGS.tgt,
        train_split=FLAGS.train_split,
        dev_split=FLAGS.dev_split or None,
        max_minutes=None if FLAGS.train_steps else FLAGS.minutes,
        checkpoint_every=100,
        keep_checkpoints=FLAGS.average,
        precision=FLAGS.precision,
    )
    steps = FLAGS.train_steps or 1_000_000  # the time budget ends it
    train(config.replace(train_steps=steps), options, student_dir)


def export_student(student_dir: str, export: str) -> None:
    import tensorflow as tf

    from tf_transformer.exporting.saved_model import export_run
    from tf_transformer.training.averaging import average_checkpoints

    state = tf.train.get_checkpoint_state(os.path.join(student_dir, "checkpoints"))
    averaged = average_checkpoints(student_dir, last=min(FLAGS.average, len(state.all_model_checkpoint_paths)))
    export_run(student_dir, export, checkpoint=averaged, overwrite=True)


def run():
    run_main(main)


if __name__ == "__main__":
    run()

"""tft-distill end to end on a tiny teacher: sharded translation, a deep-encoder shallow-decoder student that
trains, resumes, exports, serves and converts, and a second run that finds every stage done."""

import json

import pytest

from tests.commands import run_command
from tf_transformer.inference.corpus_translation import count_lines


@pytest.mark.slow
def test_a_tiny_teacher_to_an_exported_student(tiny_run, tmp_path):
    work = tmp_path / "work"
    flags = [
        "--teacher_dir", str(tiny_run), "--data", str(tiny_run.parent / "corpus"), "--work_dir", str(work),
        "--student", "tiny", "--set", "encoder_layers=3", "--set", "decoder_layers=1", "--train_steps", "4",
        "--dev_split", "", "--shards", "2", "--batch_size", "16", "--precision", "float32", "--average", "2",
    ]  # fmt: skip

    def distill(*more):
        result = run_command("tft-distill", *flags, *more)
        assert result.returncode == 0, result.stderr[-3000:]
        return result

    one = distill("--shard", "1/2")  # one task of an array: its shard only
    assert "shard 1/2 done" in one.stderr and (work / "data" / "train.de-00001-of-00002").exists()
    assert not (work / "data" / "train.de").exists()
    distill()  # the other shard, the join, the student, its export
    stages = json.loads((work / "stages.json").read_text())
    assert set(stages) == {"teacher_export", "teacher_translation", "student_training", "student_export"}
    assert all(stage["seconds"] > 0 for stage in stages.values())
    assert count_lines(str(work / "data" / "train.de")) == count_lines(str(tiny_run.parent / "corpus" / "train.en"))
    config = json.loads((work / "student" / "config.json").read_text())["model"]
    assert (config["encoder_layers"], config["decoder_layers"]) == (3, 1)
    assert (work / "student" / "sp.model").read_bytes() == (tiny_run / "sp.model").read_bytes()  # the teacher's

    again = distill()
    assert again.stderr.count(": done (") == 4  # every stage found done

    # Unequal depths resume: the student's training taken further from its checkpoint.
    del stages["student_training"], stages["student_export"]
    (work / "stages.json").write_text(json.dumps(stages))
    resumed = distill("--train_steps", "6")
    assert "teacher_translation: done" in resumed.stderr
    export = work / "student_export" / "1"
    served = run_command("tft-translate", "--model", str(export), input="alpha beta\nzeta\n")
    assert served.returncode == 0 and len(served.stdout.split("\n")) == 3

    pytest.importorskip("ctranslate2")
    converted = run_command(
        "tft-export", "--model_dir", str(work / "student"), "--output", str(tmp_path / "ct2"), "--format", "ctranslate2"
    )
    assert converted.returncode == 0, converted.stderr[-2000:]
    assert (tmp_path / "ct2" / "model.bin").exists()

"""``tft-import``: make a model trained elsewhere a run directory (an OPUS-MT model in either layout).

tft-import --source opus-mt-en-de --model_dir runs/opus_en_de

The run directory works with tft-export, tft-translate, tft-evaluate, tft-score, tft-attention and
tft-train --init_from (fine-tuning) as one of ours. Nothing comes from the network: --source is a local
directory in Hugging Face's layout (config.json, model.safetensors or pytorch_model.bin, source.spm,
target.spm, vocab.json) or Marian's (decoder.yml, the model .npz, its .vocab.yml, source.spm, target.spm;
docs/importing.md), or a .zip of either (an OPUS-MT release as downloaded).
"""

from __future__ import annotations

import json

from absl import app, flags

from tf_transformer.cli import run_main

FLAGS = flags.FLAGS
flags.DEFINE_string(
    "source",
    None,
    "The OPUS-MT model to import: a directory in Hugging Face's layout (config.json) or Marian's (decoder.yml), "
    "or a .zip of one (an OPUS-MT release).",
)
flags.DEFINE_string("model_dir", None, "The run directory to write (a new one).", required=True)
flags.DEFINE_enum(
    "position_timescales",
    "tensor2tensor",
    ["tensor2tensor", "paper"],
    "The sinusoids' frequencies: tensor2tensor, those Marian trained OPUS-MT models with (the default), or "
    "paper, those of Hugging Face's port (its outputs exactly; docs/importing.md).",
)
flags.DEFINE_bool("overwrite", False, "Replace an existing --model_dir.")
flags.mark_flag_as_required("source")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    from tf_transformer.importing.imported_run import import_opus_mt
    from tf_transformer.run_dir import load_run

    try:
        import_opus_mt(FLAGS.source, FLAGS.model_dir, FLAGS.position_timescales, FLAGS.overwrite)
    except (FileExistsError, ValueError, OSError) as error:  # ModelImportError is a ValueError
        raise app.UsageError(str(error)) from None
    config, _ = load_run(FLAGS.model_dir)
    print(json.dumps({"model_dir": FLAGS.model_dir, "model": config.to_dict()}))


def run():
    run_main(main)


if __name__ == "__main__":
    run()

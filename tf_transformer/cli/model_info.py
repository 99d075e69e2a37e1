"""``tft-model-info``: build a preset and print its size as one JSON line.

tft-model-info --config base --vocab_size 37000
"""

from __future__ import annotations

import json

from absl import app, flags

from configs import get_config, preset_names
from tf_transformer.cli import run_main

FLAGS = flags.FLAGS
flags.DEFINE_enum("config", "base", preset_names(), "Preset name: tiny, small, base, big or a Table 3 row (A1 … E).")
flags.DEFINE_integer("vocab_size", None, "Shared vocabulary size (default: the preset's).", lower_bound=1)


def model_info(config_name: str, vocab_size: int | None = None) -> dict:
    """Builds the model for ``config_name`` and returns its size and shape facts."""
    from tf_transformer.model import build_transformer  # deferred: flags parse without TensorFlow

    overrides = {"vocab_size": vocab_size} if vocab_size else {}
    config = get_config(config_name, **overrides)
    model = build_transformer(config)
    embedding_params = sum(int(w.numpy().size) for w in model.target_embedding.weights)
    if not config.shared_embeddings:
        embedding_params += sum(int(w.numpy().size) for w in model.source_embedding.weights)
    return {
        "config": config.name,
        "params": int(model.count_params()),
        "embedding_params": embedding_params,
        "encoder_layers": len(model.encoder.encoder_layers),
        "decoder_layers": len(model.decoder.decoder_layers),
        "key_dim": config.head_key_dim,
        "value_dim": config.head_value_dim,
        "model": config.to_dict(),
    }


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    print(json.dumps(model_info(FLAGS.config, FLAGS.vocab_size)))


def run():
    run_main(main)


if __name__ == "__main__":
    run()

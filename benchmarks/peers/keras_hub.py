"""keras-hub: the same architecture from ``keras_hub.layers`` (token-and-position embeddings,
``TransformerEncoder``/``TransformerDecoder``, a softmax layer), trained by ``fit``; training only."""

from __future__ import annotations

import keras

from benchmarks.peers import DecodeRun, DecodingWorkload, Training
from benchmarks.peers.workload import FLAGS, keras_fit_runner
from configs import get_config


def train_runners(size: str) -> dict[str, Training]:
    return {f"keras_hub_{precision}": trainer(size, precision) for precision in ("float32", "mixed_bfloat16")}


def decode_runners(size: str, workload: DecodingWorkload) -> dict[str, DecodeRun]:
    return {}  # keras-hub's decoding is not measured


def trainer(size: str, precision: str) -> Training:
    """The keras-hub model at ``size`` dimensions, compiled with Adam and cross-entropy, under ``precision``."""
    import keras_hub  # the package, not this module: imports are absolute

    config = get_config(size, vocab_size=FLAGS.vocab_size)
    keras.config.set_dtype_policy(precision)
    try:
        inputs = keras.Input((None,), dtype="int32", name="inputs")
        targets = keras.Input((None,), dtype="int32", name="targets")

        def embed(ids):
            return keras_hub.layers.TokenAndPositionEmbedding(
                FLAGS.vocab_size, config.max_positions, config.d_model, mask_zero=True
            )(ids)

        memory = embed(inputs)
        for _ in range(config.num_layers):
            memory = keras_hub.layers.TransformerEncoder(config.d_ff, config.num_heads, dropout=config.dropout)(memory)
        hidden = embed(targets)
        for _ in range(config.num_layers):
            hidden = keras_hub.layers.TransformerDecoder(config.d_ff, config.num_heads, dropout=config.dropout)(
                hidden, memory
            )
        logits = keras.layers.Dense(FLAGS.vocab_size, dtype="float32")(hidden)
        model = keras.Model({"inputs": inputs, "targets": targets}, logits)
        model.compile(
            optimizer=keras.optimizers.Adam(1e-4, beta_1=0.9, beta_2=0.98, epsilon=1e-9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        run = keras_fit_runner(model)
    finally:
        keras.config.set_dtype_policy("float32")
    return Training(run, {"params": int(model.count_params())})

"""Speed side by side with the toolkits users would pick instead (a benchmark, not a test).

    pip install -e '.[bench]'     # keras-hub, transformers, torch (CPU), ctranslate2, tokenizers
    python benchmarks/peers.py --size small --size base

Same machine, same run, same threads (``--threads``), same model dimensions:

- ours: the ``small``/``base`` preset, trained through Keras ``fit`` with the
  paper's loss and optimizer (float32 and mixed_bfloat16); decoding through the
  exported SavedModel's ``translate_ids`` signature (export with min = max output
  length), float32 and bfloat16 weights (``tft-export --dtype bfloat16``).
- keras-hub: the same architecture from ``keras_hub.layers`` (token-and-position
  embeddings, ``TransformerEncoder``/``TransformerDecoder``, a softmax layer).
- Hugging Face ``MarianMTModel`` (PyTorch, CPU), randomly initialised from a
  ``MarianConfig`` with the same dimensions; ``generate`` for decoding.
- CTranslate2: that Marian model converted with its transformers converter,
  ``float32`` and ``int8``.

Training: target tokens/s of optimizer steps on one identical batch
(``--train_batch`` sentences × ``--src_len`` / ``--tgt_len`` tokens), float32 and
each system's best CPU precision (Hugging Face's bfloat16 training only on CPUs
with bfloat16 hardware unless ``--hf_bfloat16_train=always``). Decoding: beam 4,
batch 32, the first 512 sentences of newstest2013 tokenized by a SentencePiece
model trained on them (the same ids for all), every output forced to
``--output_tokens`` tokens so every system does the same work; target tokens/s.
Weights are random: this measures speed only. Ratios are ours ÷ peer, each at its
best precision unless the key names one: ``vs_ct2_fp32`` / ``vs_ct2_int8`` put our
fastest export against that CTranslate2 compute type, and ``decode_ratio_float32_vs_ct2_fp32``
and the ``_float32`` keys are float32 on both sides (where bfloat16 runs in hardware our
fastest is the bfloat16 export). The last line is one JSON object.

Systems are interleaved, because this kind of shared machine drifts by ±20 % over
minutes: every system is built and warmed up first, then training runs in
``--rounds`` rounds of a few steps of each system in turn, and decoding goes batch
by batch, each batch through every system in turn (the order rotating). Measured
one after another, a ratio could come out 20 % off depending on when each system ran.

Two threads can serve a stream of batches in three ways, and each system is measured in
those it offers: both threads on one batch at a time (every system); each batch split
into ``--streams`` parts decoded side by side (ours: an export with that many loops;
CTranslate2: ``inter_threads`` workers on the parts); and ``--workers`` whole batches
at once, one per worker (ours: concurrent calls of a one-loop export's signature, as
TF Serving runs concurrent requests; CTranslate2: ``inter_threads`` workers, each
batch submitted asynchronously). A ``--workers N`` run also measures our N-stream
export on each batch's parts and CTranslate2 in all three ways; ratios take each
system's fastest way in the run.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # as tf_transformer does: set before TensorFlow loads

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags, logging  # noqa: E402

import pipelines  # noqa: E402
from benchmarks.common import (  # noqa: E402
    StepTimer,
    has_bfloat16_hardware,
    machine,
    matmul_peak,
    rotated,
    source_batches,
)
from configs import get_config  # noqa: E402
from tf_transformer import build_transformer  # noqa: E402
from tf_transformer.flops import training_flops  # noqa: E402
from tf_transformer.training.trainer import compile_model  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("size", ["small", "base"], "Presets whose dimensions every system uses.")
flags.DEFINE_list("systems", ["ours", "keras_hub", "hf", "ct2"], "Systems to measure.")
flags.DEFINE_string("data", "../shared/data/newstest/newstest2013.en", "Source sentences for decoding.")
flags.DEFINE_integer("sentences", 512, "Sentences decoded.")
flags.DEFINE_integer("batch", 32, "Sentences per decoding batch.")
flags.DEFINE_integer("beam", 4, "Beam size.")
flags.DEFINE_integer("output_tokens", 40, "Forced output length (decoder steps) for every system.")
flags.DEFINE_integer("vocab_size", 8000, "Shared vocabulary size.")
flags.DEFINE_integer("train_batch", 64, "Training sentences per batch.")
flags.DEFINE_integer("src_len", 32, "Training source tokens per sentence.")
flags.DEFINE_integer("tgt_len", 32, "Training target tokens per sentence.")
flags.DEFINE_integer("steps", 8, "Timed training steps per system (after 2 warm-up steps; the median is reported).")
flags.DEFINE_integer("rounds", 4, "Interleaved rounds the timed training steps are split into.")
flags.DEFINE_integer("threads", 2, "Threads for every system.")
flags.DEFINE_list("parts", ["train", "decode"], "What to measure: train, decode or both.")
flags.DEFINE_integer(
    "streams",
    1,
    "Decode each batch as this many equal parts side by side: ours exported with Translator(streams=N) and run "
    "with --threads / N intra-op and --threads inter-op threads; CTranslate2 measured both ways (intra_threads = "
    "--threads, and inter_threads = N over the same parts), its faster counting. Needs --parts decode (training "
    "would run with fewer intra-op threads).",
    lower_bound=1,
)
flags.DEFINE_integer(
    "workers",
    1,
    "Decode this many whole batches at once, each on --threads / N intra-op threads (with --streams 1): ours "
    "as concurrent calls of the export's signature, as TF Serving serves concurrent requests; CTranslate2 as "
    "inter_threads = N workers, each batch submitted asynchronously. Also measured: our N-stream export on each "
    "batch's parts, CTranslate2 with intra_threads = --threads and with N workers on each batch's N parts. Hugging "
    "Face decodes the batches one after another. Needs --parts decode.",
    lower_bound=1,
)
flags.DEFINE_enum(
    "hf_bfloat16_train",
    "auto",
    ["auto", "always", "never"],
    "Measure Hugging Face training under bfloat16 autocast: auto = only on CPUs with bfloat16 hardware "
    "(emulated, it ran at 7-61 target tok/s on an AVX2 CPU: about 50 minutes for the base batches alone).",
)

PAD, EOS = pipelines.PAD_ID, pipelines.EOS_ID


def _median_tokens_per_second(times: list[float]) -> float:
    return FLAGS.train_batch * FLAGS.tgt_len / statistics.median(times)


def _training_batch():
    rng = np.random.default_rng(0)
    src = rng.integers(4, FLAGS.vocab_size, (FLAGS.train_batch, FLAGS.src_len)).astype("int32")
    tgt = rng.integers(4, FLAGS.vocab_size, (FLAGS.train_batch, FLAGS.tgt_len)).astype("int32")
    return src, tgt


def _keras_fit_runner(model):
    """``run(steps)`` → seconds of each of ``steps`` ``fit`` steps on the identical batch (warmed up here)."""
    src, tgt = _training_batch()
    data = tf.data.Dataset.from_tensors(({"inputs": src, "targets": tgt}, tgt)).repeat()

    def run(steps: int) -> list[float]:
        timer = StepTimer()
        # One step more, untimed: the first step of a fit call also starts the input iterator.
        model.fit(data, steps_per_epoch=steps + 1, epochs=1, verbose=0, callbacks=[timer])
        return timer.times[1:]

    run(2)  # tracing and first steps
    return run


# --- ours ------------------------------------------------------------------------------------------


def ours_trainer(size: str, precision: str):
    """``(run, figures)``: our preset trained by Keras ``fit`` with the paper's loss and optimizer."""
    keras.config.set_dtype_policy(precision)
    try:
        config = get_config(size, vocab_size=FLAGS.vocab_size)
        model = compile_model(build_transformer(config), config)
        run = _keras_fit_runner(model)
    finally:
        keras.config.set_dtype_policy("float32")
    figures = {
        "flops_per_step": training_flops(config, FLAGS.train_batch, FLAGS.src_len, FLAGS.tgt_len),
        "peak_key": "bfloat16" if "bfloat16" in precision else "float32",
        "params": int(model.count_params()),
    }
    return run, figures


def ours_export(size: str, dtype: str, tokenizer_path: str, work: str, streams: int | None = None) -> str:
    """Our ``size`` preset (random weights) exported for decoding with a fixed output length; returns its path.

    ``dtype`` as ``tft-export --dtype``: bfloat16 stores the weights in bfloat16.
    The export splits each batch into ``streams`` parts (``tft-export --streams``; default ``--streams``).
    """
    from tf_transformer.export import export_translator
    from tf_transformer.model import inference_copy
    from tf_transformer.translator import Translator

    config = get_config(size, vocab_size=FLAGS.vocab_size)
    model = build_transformer(config)
    if dtype != "float32":
        model = inference_copy(model, dtype)
    translator = Translator(
        model,
        pipelines.Tokenizer(tokenizer_path),
        beam_size=FLAGS.beam,
        min_length=FLAGS.output_tokens,
        max_length=FLAGS.output_tokens,
        streams=FLAGS.streams if streams is None else streams,
    )
    name = f"ours_{size}_{dtype}" + (f"_streams{streams}" if streams else "")
    return export_translator(translator, tokenizer_path, os.path.join(work, name, "1"))


def set_threads() -> None:
    """TensorFlow's threads: ``--threads / (--streams × --workers)`` per op, ``--threads`` ops at once."""
    tf.config.threading.set_intra_op_parallelism_threads(FLAGS.threads // (FLAGS.streams * FLAGS.workers))
    tf.config.threading.set_inter_op_parallelism_threads(FLAGS.threads)


def ours_decoder(size: str, dtype: str, batches: list[np.ndarray], tokenizer_path: str, work: str):
    """``run(group)`` decodes ``batches[i]`` for each ``i`` of ``group`` through :func:`ours_export`'s SavedModel.

    As a server would: with ``--workers`` N, the group's batches are N concurrent
    calls of the signature (TensorFlow runs each on its own inter-op thread).
    """
    return concurrently(ours_runner(ours_export(size, dtype, tokenizer_path, work), batches))


def one_after_another(run):
    """``run(i)`` → ``run_group(indices)``: the indices' runs in turn."""
    return lambda group: [run(i) for i in group]


def concurrently(run):
    """``run(i)`` → ``run_group(indices)``: the indices' runs at once, on ``--workers`` threads."""
    if FLAGS.workers == 1:
        return one_after_another(run)
    pool = ThreadPoolExecutor(FLAGS.workers)
    return lambda group: list(pool.map(run, group))


def ours_runner(path: str, batches: list[np.ndarray]):
    """``run(i)``: the SavedModel at ``path`` decodes ``batches[i]`` (``translate_ids``, fixed output length)."""
    import tensorflow_text  # noqa: F401  registers the SentencePiece ops the export uses

    translate = tf.saved_model.load(path).signatures["translate_ids"]

    def run(i):
        outputs = translate(inputs=tf.constant(batches[i]))["ids"].numpy()
        assert outputs.shape[1] == FLAGS.output_tokens, outputs.shape

    return run


# --- keras-hub -------------------------------------------------------------------------------------


def keras_hub_trainer(size: str, precision: str):
    """``(run, figures)``: the same architecture from keras-hub layers, trained by ``fit``."""
    import keras_hub

    config = get_config(size, vocab_size=FLAGS.vocab_size)
    keras.config.set_dtype_policy(precision)
    try:
        inputs = keras.Input((None,), dtype="int32", name="inputs")
        targets = keras.Input((None,), dtype="int32", name="targets")

        def embed(ids):
            return keras_hub.layers.TokenAndPositionEmbedding(
                FLAGS.vocab_size, config.max_length, config.d_model, mask_zero=True
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
        run = _keras_fit_runner(model)
    finally:
        keras.config.set_dtype_policy("float32")
    return run, {"params": int(model.count_params())}


# --- Hugging Face transformers (PyTorch) -----------------------------------------------------------
# Marian (and CTranslate2's Marian converter) keep <pad> as the last vocabulary id, while ours is 0:
# ids 0 and V-1 trade places on the way in, which changes no amount of work.


def marian_ids(ids: np.ndarray) -> np.ndarray:
    last = FLAGS.vocab_size - 1
    return np.where(ids == PAD, last, np.where(ids == last, PAD, ids))


def marian(size: str):
    import torch
    from transformers import MarianConfig, MarianMTModel

    config = get_config(size, vocab_size=FLAGS.vocab_size)
    torch.manual_seed(0)
    marian_config = MarianConfig(
        vocab_size=FLAGS.vocab_size,
        d_model=config.d_model,
        encoder_layers=config.num_layers,
        decoder_layers=config.num_layers,
        encoder_attention_heads=config.num_heads,
        decoder_attention_heads=config.num_heads,
        encoder_ffn_dim=config.d_ff,
        decoder_ffn_dim=config.d_ff,
        max_position_embeddings=config.max_length,
        activation_function="relu",
        dropout=config.dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=FLAGS.vocab_size - 1,
        eos_token_id=EOS,
        bos_token_id=pipelines.BOS_ID,
        decoder_start_token_id=FLAGS.vocab_size - 1,
        forced_eos_token_id=None,
    )
    return MarianMTModel(marian_config)


def hf_trainer(size: str, bf16: bool):
    """``(run, figures)``: the Marian model trained by PyTorch Adam steps (bfloat16 autocast if ``bf16``)."""
    import torch

    model = marian(size)
    model.train()
    src, tgt = (torch.from_numpy(x.astype("int64")) for x in _training_batch())
    decoder_inputs = torch.cat([torch.full_like(tgt[:, :1], FLAGS.vocab_size - 1), tgt[:, :-1]], dim=1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def run(steps: int) -> list[float]:
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(
                    input_ids=src, attention_mask=torch.ones_like(src), decoder_input_ids=decoder_inputs, labels=tgt
                ).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - start)
        return times

    run(2)
    return run, {"params": model.num_parameters()}


def hf_decoder(model, batches: list[np.ndarray]):
    """``run(group)``: ``generate`` on ``batches[i]`` for each ``i`` of ``group`` (beam search, forced length)."""
    import torch

    model.eval()
    inputs = [torch.from_numpy(marian_ids(batch).astype("int64")) for batch in batches]

    def run(i):
        with torch.inference_mode():
            out = model.generate(
                input_ids=inputs[i],
                attention_mask=(inputs[i] != FLAGS.vocab_size - 1).long(),
                num_beams=FLAGS.beam,
                do_sample=False,
                min_new_tokens=FLAGS.output_tokens,
                max_new_tokens=FLAGS.output_tokens,
            )
        assert out.shape[1] == FLAGS.output_tokens + 1, out.shape  # the start token + the forced length

    return one_after_another(run)  # on --threads threads


# --- CTranslate2 -------------------------------------------------------------------------------------


def ct2_vocabulary() -> list[str]:
    """The converted model's token names, id by id (Marian's order: ``<pad>`` last)."""
    return ["t0", "<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(4, FLAGS.vocab_size - 1)] + ["<pad>"]


def ct2_models(model, work: str) -> tuple[str, list[str]]:
    """Saves the Marian model with an offline word-level tokenizer and converts it for CTranslate2."""
    import ctranslate2
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    names = ct2_vocabulary()
    word_level = tokenizers.Tokenizer(tokenizers.models.WordLevel({n: i for i, n in enumerate(names)}, "<unk>"))
    word_level.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=word_level, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    hf_dir, ct2_dir = os.path.join(work, "marian"), os.path.join(work, "ct2")
    model.save_pretrained(hf_dir)
    tokenizer.save_pretrained(hf_dir)
    ctranslate2.converters.TransformersConverter(hf_dir).convert(ct2_dir, force=True)
    return ct2_dir, names


def ct2_decoder(
    ct2_dir: str, names: list[str], compute_type: str, batches: list[np.ndarray], streams: int = 1, workers: int = 1
):
    """``run(group)``: CTranslate2's ``translate_batch`` on ``batches[i]`` for each ``i`` of ``group`` (as tokens,
    output length forced), one way of using ``--threads`` threads:

    - ``streams == workers == 1``: one batch after another on all threads;
    - ``streams > 1``: ``inter_threads=streams`` workers of ``--threads / streams``
      threads each translate a batch's ``streams`` equal parts at once (as our
      export splits it), submitted asynchronously;
    - ``workers > 1``: ``inter_threads=workers`` workers of ``--threads / workers``
      threads, each translating whole batches of the group, all submitted asynchronously.
    """
    import ctranslate2

    assert streams == 1 or workers == 1, (streams, workers)
    parallel = max(streams, workers)
    translator = ctranslate2.Translator(
        ct2_dir,
        device="cpu",
        compute_type=compute_type,
        intra_threads=FLAGS.threads // parallel,
        inter_threads=parallel,
    )
    last = FLAGS.vocab_size - 1
    token_batches = [[[names[i] for i in marian_ids(row) if i != last] for row in batch] for batch in batches]
    options = dict(
        beam_size=FLAGS.beam,
        max_batch_size=FLAGS.batch,
        min_decoding_length=FLAGS.output_tokens,
        max_decoding_length=FLAGS.output_tokens,
    )

    def parts(i):
        """``batches[i]`` in ``streams`` equal parts."""
        part = -(-len(token_batches[i]) // streams)
        return [token_batches[i][start : start + part] for start in range(0, len(token_batches[i]), part)]

    def check(results):
        lengths = {len(r.hypotheses[0]) for r in results}
        assert lengths == {FLAGS.output_tokens}, lengths

    def run(group):
        if parallel == 1:
            for i in group:
                check(translator.translate_batch(token_batches[i], **options))
            return
        # streams: each batch's parts at once, batch after batch; workers: the group's whole batches at once.
        for pieces in [parts(i) for i in group] if streams > 1 else [[token_batches[i] for i in group]]:
            pending = [translator.translate_batch(piece, asynchronous=True, **options) for piece in pieces]
            check([result.result() for piece in pending for result in piece])

    return run


# --- driver ------------------------------------------------------------------------------------------


def decoding_batches(work: str) -> tuple[list[np.ndarray], str]:
    with open(FLAGS.data, encoding="utf-8") as handle:
        lines = [line.strip() for line in handle][: FLAGS.sentences]
    path = pipelines.train_sentencepiece(
        ((line, line) for line in lines), os.path.join(work, "sp.model"), vocab_size=FLAGS.vocab_size
    )
    return source_batches(pipelines.Tokenizer(path), lines, FLAGS.batch), path


def _ratio(ours: float | None, peer: float | None) -> float | None:
    return round(ours / peer, 3) if ours and peer else None


def _set_mfu(result: dict, ours: dict, peaks: dict) -> None:
    """``result["train_mfu"]`` from ``ours`` (our training figures) and the best peaks of the run."""
    best_key = max(ours, key=lambda k: ours[k]["tokens_per_second"])
    for figures in ours.values():
        figures["mfu"] = round(figures["achieved_flops"] / peaks[figures["peak_key"]], 4)
    result["train_mfu"] = ours[best_key]["mfu"]
    result["train_mfu_precision"] = best_key.removeprefix("ours_")


def interleaved_training(runners: dict, log) -> dict:
    """Target tokens/s of each ``run(steps)`` in ``runners``: ``--rounds`` interleaved rounds, median step.

    Every round times ``--steps / --rounds`` steps of each system in turn (the
    order rotating), so a slow phase of a shared machine hits all systems alike
    instead of whichever ran then.
    """
    per_round = FLAGS.steps // FLAGS.rounds
    times = {name: [] for name in runners}
    for round_ in range(FLAGS.rounds):
        for name in rotated(list(runners), round_):
            times[name] += runners[name](per_round)
    speeds = {name: _median_tokens_per_second(t) for name, t in times.items()}
    for name, speed in speeds.items():
        log(f"train {name}", round(speed))
    return speeds


def interleaved_decoding(runners: dict, batches: list[np.ndarray], log) -> dict:
    """Target tokens/s of each ``run(group)`` in ``runners`` over all ``batches``, interleaved group by group.

    A group is ``--workers`` consecutive batches (one batch without ``--workers``).
    Each system first decodes the first group once untimed (tracing, warm-up);
    then every group is decoded by every system in turn (the order rotating), so
    drift of a shared machine's speed during the run falls on all systems alike.
    """
    groups = [list(range(i, min(i + FLAGS.workers, len(batches)))) for i in range(0, len(batches), FLAGS.workers)]
    for run in runners.values():
        run(groups[0])
    seconds = dict.fromkeys(runners, 0.0)
    for g, group in enumerate(groups):
        for name in rotated(list(runners), g):
            start = time.perf_counter()
            runners[name](group)
            seconds[name] += time.perf_counter() - start
    tokens = sum(len(b) for b in batches) * FLAGS.output_tokens
    speeds = {name: round(tokens / spent, 1) for name, spent in seconds.items()}
    for name, speed in speeds.items():
        log(f"decode {name}", speed)
    return speeds


def measure_size(size: str, batches, tokenizer_path: str, work: str, peaks: dict) -> dict:
    """Every system's training and decoding speed at ``size`` dimensions, systems interleaved."""
    systems = set(FLAGS.systems)
    log = lambda what, value: print(f"[{size}] {what}: {value}", flush=True)  # noqa: E731
    if systems & {"hf", "ct2"}:
        import torch

        torch.set_num_threads(FLAGS.threads)
    train = measure_training(size, systems, peaks, log) if "train" in FLAGS.parts else {}
    decode = measure_decoding(size, systems, batches, tokenizer_path, work, log) if "decode" in FLAGS.parts else {}

    def best(table, prefix, key=None):
        values = [(v[key] if key else v) for k, v in table.items() if k.startswith(prefix)]
        return max(values) if values else None

    ours_train_best = best(train, "ours", "tokens_per_second")
    ours_decode_best = best(decode, "ours")
    return {
        "ours_train": {k: v for k, v in train.items() if k.startswith("ours")},
        "train_tokens_per_second": {k: v["tokens_per_second"] for k, v in train.items()},
        "decode_tokens_per_second": decode,
        "params": {k: v["params"] for k, v in train.items()},
        "train_ratio_vs_keras_hub": _ratio(ours_train_best, best(train, "keras_hub", "tokens_per_second")),
        "train_ratio_vs_hf": _ratio(ours_train_best, best(train, "hf", "tokens_per_second")),
        "train_ratio_vs_hf_float32": _ratio(
            train.get("ours_float32", {}).get("tokens_per_second"), train.get("hf_float32", {}).get("tokens_per_second")
        ),
        "decode_ratio_vs_hf": _ratio(ours_decode_best, best(decode, "hf")),
        "decode_ratio_vs_hf_float32": _ratio(decode.get("ours_float32"), decode.get("hf_float32")),
        # Against CTranslate2's faster way of using the threads when it was measured both ways.
        "decode_ratio_vs_ct2_fp32": _ratio(ours_decode_best, best(decode, "ct2_float32")),
        "decode_ratio_vs_ct2_int8": _ratio(ours_decode_best, best(decode, "ct2_int8")),
        # Float32 against float32, each in its fastest way: where bfloat16 runs in hardware our best is
        # the bfloat16 export, whose results differ a little from float32's.
        "decode_ratio_float32_vs_ct2_fp32": _ratio(best(decode, "ours_float32"), best(decode, "ct2_float32")),
    }


def measure_training(size: str, systems: set, peaks: dict, log) -> dict:
    """Every system's training figures at ``size`` dimensions, interleaved (see :func:`interleaved_training`)."""
    trainers, figures = {}, {}
    if "ours" in systems:
        for precision in ("float32", "mixed_bfloat16"):
            trainers[f"ours_{precision}"], figures[f"ours_{precision}"] = ours_trainer(size, precision)
    if "keras_hub" in systems:
        for precision in ("float32", "mixed_bfloat16"):
            trainers[f"keras_hub_{precision}"], figures[f"keras_hub_{precision}"] = keras_hub_trainer(size, precision)
    if "hf" in systems:
        hf_bf16_train = FLAGS.hf_bfloat16_train == "always" or (
            FLAGS.hf_bfloat16_train == "auto" and has_bfloat16_hardware()
        )
        for bf16 in (False, True) if hf_bf16_train else (False,):
            name = f"hf_{'bfloat16' if bf16 else 'float32'}"
            trainers[name], figures[name] = hf_trainer(size, bf16)
    speeds = interleaved_training(trainers, log)
    train = {name: {**figures[name], "tokens_per_second": round(speed)} for name, speed in speeds.items()}
    for name, entry in train.items():
        if name.startswith("ours"):
            entry["achieved_flops"] = round(
                entry.pop("flops_per_step") * speeds[name] / (FLAGS.train_batch * FLAGS.tgt_len)
            )
            # The peak is re-measured after each size's training and the MFU divides by the best
            # peak of the whole run (see main): on a shared machine one measurement can come out
            # low (a single start-up measurement once gave an MFU above 1).
            peaks[entry["peak_key"]] = max(peaks[entry["peak_key"]], matmul_peak(entry["peak_key"]))
    del trainers  # free the training models before decoding (they hold reference cycles)
    gc.collect()
    return train


def measure_decoding(size: str, systems: set, batches, tokenizer_path: str, work: str, log) -> dict:
    """Every system's decoding speed at ``size`` dimensions, interleaved (see :func:`interleaved_decoding`)."""
    decoders = {}
    if "ours" in systems:
        for dtype in ("float32", "bfloat16"):
            decoders[f"ours_{dtype}"] = ours_decoder(size, dtype, batches, tokenizer_path, work)
        if FLAGS.workers > 1:  # our other way of using that many threads: each batch in parts, one loop each
            path = ours_export(size, "float32", tokenizer_path, work, streams=FLAGS.workers)
            decoders[f"ours_float32_streams{FLAGS.workers}"] = one_after_another(ours_runner(path, batches))
    if "hf" in systems:
        import copy

        import torch

        model = marian(size)
        decoders["hf_float32"] = hf_decoder(model, batches)
        decoders["hf_bfloat16"] = hf_decoder(copy.deepcopy(model).to(torch.bfloat16), batches)
    if "ct2" in systems:
        ct2_dir, names = ct2_models(marian(size), os.path.join(work, f"ct2_{size}"))
        for compute_type in ("float32", "int8"):
            decoders[f"ct2_{compute_type}"] = ct2_decoder(ct2_dir, names, compute_type, batches)
            if FLAGS.streams > 1:
                decoders[f"ct2_{compute_type}_streams{FLAGS.streams}"] = ct2_decoder(
                    ct2_dir, names, compute_type, batches, streams=FLAGS.streams
                )
            if FLAGS.workers > 1:  # its two ways of using that many workers
                decoders[f"ct2_{compute_type}_streams{FLAGS.workers}"] = ct2_decoder(
                    ct2_dir, names, compute_type, batches, streams=FLAGS.workers
                )
                decoders[f"ct2_{compute_type}_workers{FLAGS.workers}"] = ct2_decoder(
                    ct2_dir, names, compute_type, batches, workers=FLAGS.workers
                )
    return interleaved_decoding(decoders, batches, log)


def main(argv):
    del argv
    if not os.path.exists(FLAGS.data):
        raise app.UsageError(f"--data {FLAGS.data}: not found (real corpora live in ../shared/data)")
    if FLAGS.rounds < 1 or FLAGS.steps % FLAGS.rounds:
        raise app.UsageError(f"--steps {FLAGS.steps} must be a positive multiple of --rounds {FLAGS.rounds}")
    if not set(FLAGS.parts) <= {"train", "decode"} or not FLAGS.parts:
        raise app.UsageError(f"--parts {','.join(FLAGS.parts)}: give train, decode or both")
    if FLAGS.streams > 1 and "train" in FLAGS.parts:
        raise app.UsageError("--streams needs --parts decode: training would run with fewer intra-op threads")
    if FLAGS.threads % FLAGS.streams:
        raise app.UsageError(f"--threads {FLAGS.threads} must be a multiple of --streams {FLAGS.streams}")
    if FLAGS.workers > 1 and "train" in FLAGS.parts:
        raise app.UsageError("--workers needs --parts decode: training would run with fewer intra-op threads")
    if FLAGS.workers > 1 and FLAGS.streams > 1:
        raise app.UsageError("--workers and --streams are two ways to use the threads: give one")
    if FLAGS.threads % FLAGS.workers:
        raise app.UsageError(f"--threads {FLAGS.threads} must be a multiple of --workers {FLAGS.workers}")
    batches = -(-FLAGS.sentences // FLAGS.batch)
    if batches % FLAGS.workers:
        raise app.UsageError(
            f"--sentences {FLAGS.sentences} make {batches} batches of {FLAGS.batch}, not a multiple of "
            f"--workers {FLAGS.workers}: the last group would leave workers idle"
        )
    logging.set_verbosity(logging.WARNING)
    set_threads()
    peaks = {"float32": matmul_peak("float32"), "bfloat16": matmul_peak("bfloat16")}
    results = {}
    with tempfile.TemporaryDirectory() as work:
        batches, tokenizer_path = decoding_batches(work)
        for size in FLAGS.size:
            results[size] = measure_size(size, batches, tokenizer_path, work, peaks)
            print(json.dumps({size: results[size]}), flush=True)
    for result in results.values():  # every MFU against the best peaks of the whole run
        if result["ours_train"]:
            _set_mfu(result, result["ours_train"], peaks)
    headline = results.get("base") or results[FLAGS.size[-1]]
    keys = [
        "train_ratio_vs_keras_hub",
        "train_ratio_vs_hf",
        "decode_ratio_vs_hf",
        "decode_ratio_vs_ct2_fp32",
        "decode_ratio_float32_vs_ct2_fp32",
        "decode_ratio_vs_ct2_int8",
        "train_mfu",
    ]
    print(
        json.dumps(
            {
                "benchmark": "peers",
                **{key: headline.get(key) for key in keys},
                "headline_size": "base" if "base" in results else FLAGS.size[-1],
                "results": results,
                "peak_matmul_flops": {k: round(v) for k, v in peaks.items()},
                "decode": {"beam": FLAGS.beam, "batch": FLAGS.batch, "sentences": FLAGS.sentences},
                "output_tokens": FLAGS.output_tokens,
                "train_batch": [FLAGS.train_batch, FLAGS.src_len, FLAGS.tgt_len],
                "threads": FLAGS.threads,
                "parts": FLAGS.parts,
                "streams": FLAGS.streams,
                "workers": FLAGS.workers,
                "hf_bfloat16_train": FLAGS.hf_bfloat16_train,
                "bfloat16_hardware": has_bfloat16_hardware(),
                "machine": machine(),
                "tensorflow": tf.__version__,
            }
        )
    )


if __name__ == "__main__":
    app.run(main)

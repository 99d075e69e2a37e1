"""Training: loss, metrics, schedule, accumulation, strategies, XLA shapes, checkpoints, averaging, resume."""

import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import pipelines
from configs import get_config
from tests import corpora
from tests.corpora import write_corpus
from tf_transformer import build_transformer
from tf_transformer.run_dir import load_run, restore_model
from tf_transformer.training import (
    LabelSmoothedCrossEntropy,
    TokenAccuracy,
    TokenPerplexity,
    TransformerSchedule,
    paper_optimizer,
)
from tf_transformer.training.averaging import average_checkpoints, choose_averaging, last_checkpoints
from tf_transformer.training.losses import TreeCrossEntropy, label_smoothed_nll
from tf_transformer.training.optimizers import FusedAdam
from tf_transformer.training.trainer import compile_model, train

ROOT = pathlib.Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(3)
BIN = pathlib.Path(sys.executable).parent


def np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


# --- recipe ----------------------------------------------------------------------------------------


def test_schedule_is_eq3_and_serializable():
    schedule = TransformerSchedule(d_model=512, warmup_steps=4000)
    for step in (1, 100, 4000, 10_000, 100_000):
        expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert float(schedule(step - 1)) == pytest.approx(expected, rel=1e-5)  # Keras counts from 0
    peak = float(schedule(3999))
    assert peak == pytest.approx(512**-0.5 * 4000**-0.5, rel=1e-5)
    clone = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    assert isinstance(clone, TransformerSchedule) and clone.get_config() == schedule.get_config()
    scaled = TransformerSchedule(256, 100, scale=2.0, accumulate_steps=4)
    assert float(scaled(4 * 9 + 3)) == pytest.approx(2.0 * 256**-0.5 * min(10**-0.5, 10 * 100**-1.5), rel=1e-5)


def test_paper_optimizer_hyperparameters():
    optimizer = paper_optimizer(512)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)


def test_label_smoothed_loss_matches_numpy_and_ignores_padding():
    logits = RNG.normal(size=(2, 4, 7)).astype("float32")
    labels = np.array([[3, 5, 2, 0], [1, 0, 0, 0]], "int32")
    eps = 0.1
    log_probs = np_log_softmax(logits.astype(np.float64))
    target = np.full((2, 4, 7), eps / 7)
    target[np.arange(2)[:, None], np.arange(4)[None, :], labels] += 1 - eps
    per_token = -(target * log_probs).sum(-1)
    mask = labels != 0
    expected = per_token[mask].mean()
    loss = LabelSmoothedCrossEntropy(eps)(labels, logits)
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    changed = logits.copy()
    changed[~mask] = 100.0  # logits at padded positions do not matter
    assert float(LabelSmoothedCrossEntropy(eps)(labels, changed)) == pytest.approx(expected, rel=1e-5)
    unsmoothed = float(LabelSmoothedCrossEntropy(0.0)(labels, logits))
    nll = -log_probs[np.arange(2)[:, None], np.arange(4)[None, :], labels]
    assert unsmoothed == pytest.approx(nll[mask].mean(), rel=1e-5)
    # Half-precision logits: the loss is still computed in float32.
    assert LabelSmoothedCrossEntropy(eps)(labels, tf.cast(logits, tf.bfloat16)).dtype == tf.float32
    # Gradient: (softmax − q) at non-padding positions, divided by their count.
    variable = tf.Variable(logits)
    with tf.GradientTape() as tape:
        value = LabelSmoothedCrossEntropy(eps)(labels, variable)
    softmax = np.exp(log_probs)
    expected_gradient = (softmax - target) * mask[..., None] / mask.sum()
    np.testing.assert_allclose(np.asarray(tape.gradient(value, variable)), expected_gradient, atol=1e-6)


class _AllowedLoss(LabelSmoothedCrossEntropy):
    """The loss limited to a fixed ``allowed`` set (as ``TreeCrossEntropy`` is to the tree constraint's)."""

    def __init__(self, eps, allowed):
        super().__init__(eps)
        self.set = tf.constant(allowed)

    def token_loss(self, labels, logits):
        return label_smoothed_nll(labels, logits, self.label_smoothing, self.set)


def test_a_loss_over_allowed_tokens_is_the_softmax_and_smoothing_over_them_only():
    logits = RNG.normal(size=(2, 4, 7)).astype("float32")
    labels = np.array([[3, 5, 2, 0], [1, 4, 0, 0]], "int32")
    allowed = RNG.random((2, 4, 7)) < 0.5
    allowed[np.arange(2)[:, None], np.arange(4)[None, :], labels] = True
    allowed[1, 1] = False
    allowed[1, 1, 4] = True  # one token allowed: forced, no loss and no gradient
    eps = 0.1
    masked = np.where(allowed, logits.astype(np.float64), -np.inf)
    log_probs = masked - np.log(np.exp(masked).sum(-1, keepdims=True))
    target = allowed * (eps / allowed.sum(-1, keepdims=True))
    target[np.arange(2)[:, None], np.arange(4)[None, :], labels] += 1 - eps
    per_token = -(target * np.where(allowed, log_probs, 0.0)).sum(-1)
    mask = labels != 0
    assert per_token[1, 1] == pytest.approx(0.0, abs=1e-12)
    variable = tf.Variable(logits)
    with tf.GradientTape() as tape:
        value = _AllowedLoss(eps, allowed)(labels, variable)
    assert float(value) == pytest.approx(per_token[mask].mean(), rel=1e-5)
    gradient = np.asarray(tape.gradient(value, variable))
    expected_gradient = (np.exp(log_probs) - target) * mask[..., None] / mask.sum()
    np.testing.assert_allclose(gradient, expected_gradient, atol=1e-6)
    np.testing.assert_allclose(gradient[1, 1], 0.0, atol=1e-7)  # 1 − ε − (1 − ε), rounded
    assert not gradient[~allowed].any()
    every = _AllowedLoss(eps, np.ones_like(allowed))(labels, logits)
    assert float(every) == pytest.approx(float(LabelSmoothedCrossEntropy(eps)(labels, logits)), rel=1e-6)


class _FixedConstraint:
    """Stands for a ``TreeConstraint`` whose allowed set along any target is ``allowed``."""

    def __init__(self, allowed):
        self.allowed = allowed
        self.opens = np.zeros(allowed.shape[-1], bool)

    def allowed_along(self, labels):
        return tf.constant(self.allowed)


def test_a_tree_loss_costs_nothing_on_forced_tokens_and_unforced_keeps_the_whole_softmax_elsewhere():
    logits = RNG.normal(size=(1, 4, 6)).astype("float32")
    labels = np.array([[2, 3, 5, 1]], "int32")
    allowed = np.zeros((1, 4, 6), bool)
    allowed[0, 0, [2, 4]] = allowed[0, 2, [1, 5]] = allowed[0, 3, [1, 2, 3]] = True  # position 1: only its label
    per_token = label_smoothed_nll(labels, logits, 0.1).numpy()[0]  # over every token
    unforced = TreeCrossEntropy(_FixedConstraint(allowed), 0.1, over="unforced")(labels, logits)
    assert float(unforced) == pytest.approx((per_token[0] + per_token[2] + per_token[3]) / 4, rel=1e-6)
    over_allowed = float(TreeCrossEntropy(_FixedConstraint(allowed), 0.1)(labels, logits))
    masked = label_smoothed_nll(labels, logits, 0.1, allowed | (np.arange(6) == labels[..., None])).numpy()[0]
    assert masked[1] == pytest.approx(0.0, abs=1e-6) and over_allowed == pytest.approx(masked.mean(), rel=1e-6)
    assert over_allowed < float(unforced)


def test_token_metrics():
    logits = RNG.normal(size=(2, 3, 5)).astype("float32")
    labels = np.array([[1, 2, 0], [4, 0, 0]], "int32")
    accuracy, perplexity = TokenAccuracy(), TokenPerplexity()
    accuracy.update_state(labels, logits)
    perplexity.update_state(labels, logits)
    mask = labels != 0
    assert float(accuracy.result()) == pytest.approx((logits.argmax(-1) == labels)[mask].mean())
    nll = -np_log_softmax(logits)[np.arange(2)[:, None], np.arange(3)[None, :], labels]
    assert float(perplexity.result()) == pytest.approx(math.exp(nll[mask].mean()), rel=1e-5)


def test_loss_and_metrics_in_one_graph_match_the_fused_op_and_argmax():
    """Inside ``tf.function`` (as in ``fit``), where loss and perplexity share ops: same values as before."""
    vocab, eps = 50, 0.1
    logits = tf.constant(RNG.normal(size=(4, 6, vocab)).astype("float32") * 4)
    labels = RNG.integers(1, vocab, size=(4, 6)).astype("int32")
    labels[:, 4:] = 0
    labels[0, 0] = int(np.argmax(logits[0, 0]))  # at least one right prediction
    mask = labels != 0
    loss, accuracy, perplexity = LabelSmoothedCrossEntropy(eps), TokenAccuracy(), TokenPerplexity()

    @tf.function
    def step(logits):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            value = loss(labels, logits)
        accuracy.update_state(labels, logits)
        perplexity.update_state(labels, logits)
        return value, tape.gradient(value, logits)

    value, gradient = step(logits)
    with tf.GradientTape() as tape:
        tape.watch(logits)
        target = tf.one_hot(labels, vocab, on_value=1 - eps + eps / vocab, off_value=eps / vocab)
        per_token = tf.nn.softmax_cross_entropy_with_logits(labels=target, logits=logits)
        expected = tf.reduce_sum(per_token * mask) / mask.sum()
    np.testing.assert_allclose(float(value), float(expected), rtol=1e-6)
    np.testing.assert_allclose(gradient, tape.gradient(expected, logits), atol=1e-7)
    assert float(accuracy.result()) == pytest.approx((np.argmax(logits, -1) == labels)[mask].mean())
    nll = -np_log_softmax(logits.numpy().astype(np.float64))[np.arange(4)[:, None], np.arange(6)[None, :], labels]
    assert float(perplexity.result()) == pytest.approx(math.exp(nll[mask].mean()), rel=1e-5)


def test_loss_edge_cases():
    vocab = 6
    logits = RNG.normal(size=(2, 3, vocab)).astype("float32")
    labels = np.array([[2, 5, 1], [4, 3, 0]], "int32")
    mask = labels != 0
    log_probs = np_log_softmax(logits.astype(np.float64))
    nll = -log_probs[np.arange(2)[:, None], np.arange(3)[None, :], labels]
    # Unsmoothed: value and gradient (softmax − one_hot) at non-padding positions.
    variable = tf.Variable(logits)
    with tf.GradientTape() as tape:
        value = LabelSmoothedCrossEntropy(0.0)(labels, variable)
    assert float(value) == pytest.approx(nll[mask].mean(), rel=1e-5)
    expected = (np.exp(log_probs) - np.eye(vocab)[labels]) * mask[..., None] / mask.sum()
    np.testing.assert_allclose(tape.gradient(value, variable), expected, atol=1e-6)
    # Logits with a large common offset: exact to float32 rounding (no cancellation of large terms).
    offset = logits + np.float32(1e3)
    offset_log_probs = np_log_softmax(offset.astype(np.float64))
    for eps in (0.0, 0.1):
        target = eps / vocab + (1 - eps) * np.eye(vocab)[labels]
        expected = -(target * offset_log_probs).sum(-1)[mask].mean()
        assert float(LabelSmoothedCrossEntropy(eps)(labels, offset)) == pytest.approx(expected, rel=2e-6)
    # Any padding id, also one that is not a vocabulary index.
    padded = np.where(mask, labels, -1)
    assert float(LabelSmoothedCrossEntropy(0.0, pad_id=-1)(padded, logits)) == pytest.approx(nll[mask].mean(), rel=1e-5)
    perplexity, accuracy = TokenPerplexity(pad_id=-1), TokenAccuracy(pad_id=-1)
    perplexity.update_state(padded, logits)
    assert float(perplexity.result()) == pytest.approx(math.exp(nll[mask].mean()), rel=1e-5)
    # Tied logits: a label tied for the largest logit counts as right, one below it does not.
    tied = np.zeros((1, 2, vocab), "float32")
    tied[0, 1, 3] = 1.0
    accuracy.update_state(np.array([[1, 0]]), tied)
    assert float(accuracy.result()) == 0.5


def test_fused_adam_updates_as_keras_adam():
    """``paper_optimizer``'s Adam (one fused kernel per variable) makes Keras Adam's updates, also under Mirrored."""
    rng = np.random.default_rng(5)  # its own stream: the same numbers whichever tests ran before
    shapes = [(6, 5), (5,), (7, 5)]
    initial = [rng.normal(size=shape).astype("float32") for shape in shapes]
    gradients = [[rng.normal(size=shape).astype("float32") for shape in shapes] for _ in range(3)]
    for step_gradients in gradients:
        step_gradients[2][[0, 2, 3, 5, 6]] = 0.0  # rows an embedding lookup did not touch

    def trained(optimizer_class, strategy=None, sparse=False):
        strategy = strategy or tf.distribute.get_strategy()
        with strategy.scope():
            variables = [keras.Variable(value) for value in initial]
            optimizer = optimizer_class(
                learning_rate=TransformerSchedule(64, warmup_steps=2), beta_1=0.9, beta_2=0.98, epsilon=1e-9
            )
            optimizer.build(variables)

        @tf.function
        def apply(step_gradients):
            def replica_step():
                share = [g / strategy.num_replicas_in_sync for g in step_gradients]  # replicas' gradients are summed
                if sparse:  # as from an untied embedding lookup
                    share[2] = tf.IndexedSlices(tf.gather(share[2], [1, 4]), tf.constant([1, 4]), tf.constant((7, 5)))
                optimizer.apply_gradients(zip(share, variables, strict=True))

            strategy.run(replica_step)

        for step_gradients in gradients:
            apply([tf.constant(g) for g in step_gradients])
        return [variable.numpy() for variable in variables]

    assert isinstance(paper_optimizer(64), FusedAdam)
    reference = trained(keras.optimizers.Adam)
    for actual, expected, start in zip(trained(FusedAdam, sparse=True), reference, initial, strict=True):
        assert not np.allclose(expected, start)
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
    if len(tf.config.list_logical_devices("CPU")) >= 2:
        mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        for actual, expected in zip(trained(FusedAdam, mirrored), reference, strict=True):
            np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
    clone = keras.optimizers.deserialize(keras.optimizers.serialize(paper_optimizer(64)))
    assert isinstance(clone, FusedAdam) and clone.beta_2 == 0.98


@pytest.mark.slow
def test_user_script_in_readme_trains(tmp_path):
    script = (ROOT / "examples" / "fit_your_own.py").read_text()
    readme = (ROOT / "docs" / "training.md").read_text()
    body = script.split('"""', 2)[2].strip()
    assert body in readme, "docs/training.md must show examples/fit_your_own.py as it is"
    corpus = tmp_path / "corpus"
    write_corpus(corpus, n=200)
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "fit_your_own.py"), "--data", str(corpus), "--steps", "3"]
        + ["--vocab", str(tmp_path / "sp.model")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert math.isfinite(float(result.stdout.strip().splitlines()[-1].split()[-1]))


# --- gradient accumulation ------------------------------------------------------------------------------


def _batch(rows, length):
    ids = RNG.integers(4, 200, size=(rows, length)).astype("int32")
    return {"inputs": ids, "targets": ids[:, ::-1].copy()}, np.roll(ids, 1, axis=1)


@pytest.mark.slow
def test_accumulated_micro_batches_equal_one_batch():
    """N micro-batches with gradient accumulation make the same update as their union."""
    config = get_config("tiny", dropout=0.0)
    (f1, l1), (f2, l2) = _batch(4, 6), _batch(4, 6)  # no padding: equal token counts
    union = ({k: np.concatenate([f1[k], f2[k]]) for k in f1}, np.concatenate([l1, l2]))

    def trained(optimizer, batches):
        keras.utils.set_random_seed(11)
        model = build_transformer(config)
        model.compile(optimizer=optimizer, loss=LabelSmoothedCrossEntropy(0.1))
        for features, labels in batches:
            model.train_on_batch(features, labels)
        return model

    accumulated = trained(keras.optimizers.SGD(0.5, gradient_accumulation_steps=2), [(f1, l1), (f2, l2)])
    whole = trained(keras.optimizers.SGD(0.5), [union])
    for a, b in zip(accumulated.get_weights(), whole.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=2e-6)
    assert int(accumulated.optimizer.iterations) == int(whole.optimizer.iterations) == 1
    # The paper's optimizer: the schedule advances once per update, not per micro-batch.
    optimizer = paper_optimizer(32, warmup_steps=10, accumulate_steps=2)
    model = trained(optimizer, [(f1, l1), (f2, l2), (f1, l1), (f2, l2)])
    assert int(model.optimizer.iterations) == 2
    assert float(optimizer._get_current_learning_rate()) == pytest.approx(32**-0.5 * 3 * 10**-1.5, rel=1e-5)


# --- runs --------------------------------------------------------------------------------------------------


def tiny_config(**changes):
    return corpora.tiny_config(**{"train_steps": 6, **changes})


def tiny_options(train_corpus_dir, **changes):
    return corpora.tiny_options(train_corpus_dir, **{"steps_per_epoch": 3, "checkpoint_every": 2, **changes})


@pytest.mark.slow
def test_train_writes_a_complete_model_dir_and_tensorboard(tmp_path, train_corpus_dir):
    options = tiny_options(train_corpus_dir, dev_split="val", dev_bleu_sentences=5, log_every=1)
    summary = train(tiny_config(), options, str(tmp_path / "run"))
    run = tmp_path / "run"
    assert summary["steps"] == 6 and math.isfinite(summary["history"]["loss"][-1])
    config, stored = load_run(str(run))
    # Format 2: the model config holds the run settings as used, the run the vocabulary size asked.
    assert json.loads((run / "config.json").read_text())["format"] == 2
    assert (config.train_steps, config.tokens_per_batch, config.max_train_length) == (6, 512, 64)
    assert config.vocab_size == pipelines.Tokenizer(str(run / "sp.model")).vocab_size and stored["vocab_size"] == 120
    assert not {"train_steps", "tokens_per_batch", "max_train_length"} & set(stored)
    # The options as the run took them: resolved for the machine, with why; no process-local values.
    assert stored["precision"] == "float32" and stored["precision_reason"] == "given by --precision"
    assert stored["jit_compile"] is False and "budget_start" not in stored
    assert json.loads((run / "config.json").read_text())["run"] == stored
    assert [os.path.basename(p) for p in last_checkpoints(str(run), 3)] == [
        "ckpt-3",
        "ckpt-4",
        "ckpt-6",
    ]  # every 2 steps and at epoch ends (3 steps)
    assert "val_loss" in summary["history"] and summary["dev_bleu"] is not None
    tags, images = set(), {}
    for event_file in (run / "logs").rglob("events.out.tfevents.*"):
        for record in tf.data.TFRecordDataset(str(event_file)):
            event = tf.compat.v1.Event.FromString(record.numpy())
            tags.update(value.tag for value in event.summary.value)
            images.update(
                (value.tag, (event.step, value.tensor.string_val[2]))
                for value in event.summary.value
                if value.metadata.plugin_data.plugin_name == "images"
            )
    for tag in ("learning_rate", "target_tokens_per_second", "bleu", "sample_translations", "epoch_loss"):
        assert tag in tags, tags
    # Each epoch, the attention of the first 3 dev sentences: encoder-decoder per layer, encoder layer 1 of 2.
    names = [f"attention/{kind}/sentence_{n}" for kind in ("encoder_decoder", "encoder_self_layer1") for n in (1, 2, 3)]
    assert sorted(images) == sorted(names)
    for step, png in images.values():
        assert step == 6 and tf.io.decode_png(png).shape[2] == 4  # the last epoch's, a whole RGBA PNG
    model, _ = restore_model(str(run))
    assert model.count_params() == summary["params"]
    # Every weight comes from the checkpoint: two fresh restores agree exactly
    # (a weight missing from the checkpoint would keep its random initial value).
    again, _ = restore_model(str(run))
    for a, b in zip(model.get_weights(), again.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_mirrored_strategy_over_two_logical_cpus(tmp_path, train_corpus_dir):
    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs two logical CPU devices (set in conftest before TensorFlow starts)")
    """Each global batch split over two replicas makes the update one device makes on it: the same weights."""
    config = tiny_config(dropout=0.0)  # dropout masks are drawn per replica
    runs = {}
    for strategy in ("one_device", "mirrored"):
        options = tiny_options(train_corpus_dir, strategy=strategy)
        runs[strategy] = train(config, options, str(tmp_path / strategy))
        assert runs[strategy]["steps"] == 6
    for one, mirrored in zip(
        _final_weights(str(tmp_path / "one_device")), _final_weights(str(tmp_path / "mirrored")), strict=True
    ):
        np.testing.assert_allclose(mirrored, one, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(runs["mirrored"]["history"]["loss"], runs["one_device"]["history"]["loss"], rtol=1e-4)


@pytest.mark.slow
def test_xla_sees_one_shape_per_bucket(tmp_path, train_corpus_dir):
    tokenizer_path = tmp_path / "sp.model"
    corpus = pipelines.find_split(str(train_corpus_dir), "train", "en", "de")
    pipelines.train_sentencepiece(corpus.pairs(), str(tokenizer_path), vocab_size=120)
    tokenizer = pipelines.Tokenizer(str(tokenizer_path))
    data = pipelines.training_dataset(
        corpus, tokenizer, tokens_per_batch=512, max_train_length=64, pad_to_bucket_boundary=True
    )
    shapes = set()

    def record(features, labels):
        shapes.add((tuple(features["inputs"].shape), tuple(labels.shape)))
        return features, labels

    batches = [record(f, lab) for f, lab in data.dataset]
    config = get_config("tiny", vocab_size=tokenizer.vocab_size)
    model = compile_model(build_transformer(config), config, jit_compile=True)
    feed = tf.data.Dataset.from_generator(
        lambda: iter(batches),
        output_signature=data.dataset.element_spec,
    )
    history = model.fit(feed, epochs=1, verbose=0)
    assert math.isfinite(history.history["loss"][0])
    used = {length for length in data.buckets.padded_lengths if any(s[0][1] == length for s in shapes)}
    assert len(shapes) == len(used) <= len(data.buckets.padded_lengths)  # XLA compiles one program per shape


@pytest.mark.slow
def test_average_is_exactly_the_mean_of_the_last_checkpoints(tmp_path, train_corpus_dir):
    run = str(tmp_path / "run")
    train(tiny_config(), tiny_options(train_corpus_dir, checkpoint_every=1), run)
    paths = last_checkpoints(run, 3)
    model, _ = restore_model(run, paths[0])
    per_checkpoint = []
    for path in paths:
        tf.train.Checkpoint(model=model).restore(path).expect_partial()
        per_checkpoint.append([w.numpy().copy() for w in model.weights])
    assert not np.array_equal(per_checkpoint[0][0], per_checkpoint[-1][0])
    result = subprocess.run(
        [str(BIN / "tft-average"), "--model_dir", run, "--last", "3"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    averaged_path = json.loads(result.stdout.strip().splitlines()[-1])["averaged"]
    tf.train.Checkpoint(model=model).restore(averaged_path).expect_partial()
    for index, weight in enumerate(model.weights):
        expected = np.mean(np.stack([c[index] for c in per_checkpoint]).astype(np.float64), axis=0).astype(np.float32)
        np.testing.assert_array_equal(weight.numpy(), expected)
    with pytest.raises(ValueError, match="keeps only"):
        average_checkpoints(run, last=99)


@pytest.mark.slow
def test_the_number_of_checkpoints_averaged_is_chosen_by_the_dev_score(tmp_path, train_corpus_dir):
    """Each count is averaged into its own directory (1 is the newest checkpoint itself, a count above those
    kept is capped), scored once, and the best by the metric wins, whichever it is."""
    run = str(tmp_path / "run")
    train(tiny_config(), tiny_options(train_corpus_dir, checkpoint_every=1), run)
    kept = len(tf.train.get_checkpoint_state(os.path.join(run, "checkpoints")).all_model_checkpoint_paths)
    assert kept >= 3
    for winner in (2, kept):
        seen, lines = [], []

        def evaluate(checkpoint, winner=winner, seen=seen):
            seen.append(checkpoint)
            count = 1 if checkpoint == last_checkpoints(run, 1)[0] else int(checkpoint.split("averaged_")[1][:-5])
            return {"bleu": 10.0 if count == winner else float(count), "count": count}

        best, scores = choose_averaging(run, [1, 2, 99], evaluate, "bleu", report=lines.append)
        assert best == winner and sorted(scores) == [1, 2, kept] and len(seen) == len(lines) == 3
        assert [scores[n][0]["count"] for n in (1, 2, kept)] == [1, 2, kept]  # each count scored its own average
        assert scores[kept][1] == os.path.join(os.path.abspath(run), f"averaged_{kept}", "ckpt")


def test_cli_errors_name_the_flag(tmp_path):
    result = subprocess.run(
        [str(BIN / "tft-train"), "--config", "tiny", "--data", str(tmp_path / "nope"), "--model_dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "--data" in result.stderr and "nope" in result.stderr
    result = subprocess.run(
        [str(BIN / "tft-train"), "--config", "tiny", "--data", str(tmp_path), "--model_dir", str(tmp_path)]
        + ["--set", "d_modle=3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "d_modle" in result.stderr


def _final_weights(run):
    model, _ = restore_model(run)
    return model.get_weights()


@pytest.mark.slow
def test_killed_run_resumes_from_its_last_checkpoint(tmp_path, train_corpus_dir):
    """SIGKILL after a checkpoint, rerun the same command: it continues and matches an uninterrupted run."""
    common = ["--config", "tiny", "--data", str(train_corpus_dir), "--dev_split", "", "--train_steps", "10"]
    common += ["--steps_per_epoch", "4", "--checkpoint_every", "2", "--tokens_per_batch", "512"]
    common += ["--max_train_length", "64", "--vocab_size", "120", "--set", "dropout=0.0", "--keep_checkpoints", "20"]
    reference = tmp_path / "reference"
    done = subprocess.run(
        [str(BIN / "tft-train"), *common, "--model_dir", str(reference)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]

    killed = tmp_path / "killed"
    process = subprocess.Popen(
        [str(BIN / "tft-train"), *common, "--model_dir", str(killed)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not (killed / "checkpoints" / "ckpt-6.index").exists():
            time.sleep(0.05)
        assert (killed / "checkpoints" / "ckpt-6.index").exists(), "no checkpoint appeared"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    interrupted_at = int(tf.train.latest_checkpoint(str(killed / "checkpoints")).rsplit("-", 1)[1])
    assert interrupted_at < 10
    resumed = subprocess.run(
        [str(BIN / "tft-train"), *common, "--model_dir", str(killed)], capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resumed from" in resumed.stderr
    summary = json.loads((killed / "train_summary.json").read_text())
    assert summary["steps"] == 10
    for a, b in zip(_final_weights(str(killed)), _final_weights(str(reference)), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4)


def test_no_checkpoint_after_a_nan_loss(tmp_path):
    """TerminateOnNaN stops the run; the checkpoint callback never saves the NaN state."""
    from tf_transformer.training.callbacks import StepCheckpoint

    model = build_transformer(get_config("tiny"))
    compile_model(model, get_config("tiny"))
    model.optimizer.build(model.trainable_variables)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(tmp_path), max_to_keep=3)
    callback = StepCheckpoint(manager, every_steps=1)
    callback.set_model(model)
    model.optimizer.iterations.assign(1)
    callback.on_train_batch_end(0, {"loss": 2.5})
    good = manager.latest_checkpoint
    assert good is not None
    model.optimizer.iterations.assign(2)
    callback.on_train_batch_end(1, {"loss": float("nan")})
    callback.on_epoch_end(0, {"loss": float("nan")})
    assert manager.latest_checkpoint == good


@pytest.mark.slow
def test_mixed_float16_counts_its_steps_for_resume_and_the_learning_rate(tmp_path, train_corpus_dir):
    """Under mixed_float16 Keras wraps the optimizer for loss scaling; the wrapper's own counter never
    moves. A finished run rerun must not train again, and the logged learning rate is eq. 3's, not 0."""
    run = tmp_path / "run"
    options = tiny_options(train_corpus_dir, precision="mixed_float16", log_every=1)
    first = train(tiny_config(train_steps=4), options, str(run))
    weights = [np.array(w) for w in restore_model(str(run))[0].weights]
    again = train(tiny_config(train_steps=4), options, str(run))
    assert first["steps"] == again["steps"] == 4
    assert os.path.basename(again["latest_checkpoint"]) == "ckpt-4" and not again["history"]  # nothing trained
    for before, after in zip(weights, restore_model(str(run))[0].weights, strict=True):
        np.testing.assert_array_equal(before, np.array(after))
    rates = []
    for event_file in (run / "logs" / "train").glob("events.out.tfevents.*"):
        for record in tf.data.TFRecordDataset(str(event_file)):
            event = tf.compat.v1.Event.FromString(record.numpy())
            rates += [tf.make_ndarray(v.tensor) for v in event.summary.value if v.tag == "learning_rate"]
    assert rates and min(rates) > 0


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_is_passed_over_at_resume_and_refused_at_export(tmp_path, train_corpus_dir):
    config = tiny_config(dropout=0.0, train_steps=4)
    options = tiny_options(train_corpus_dir, steps_per_epoch=4, checkpoint_every=2)
    train(config, options, str(tmp_path / "reference"))
    reference, _ = restore_model(str(tmp_path / "reference"))
    run = tmp_path / "run"
    train(config, options, str(run))
    data = next((run / "checkpoints").glob("ckpt-4.data-*"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])  # a write cut short
    with pytest.raises(ValueError, match="ckpt-4 is damaged"):
        restore_model(str(run))
    summary = train(config, options, str(run))  # falls back to ckpt-2 and trains steps 3 and 4 again
    assert summary["steps"] == 4 and summary["history"]
    resumed, _ = restore_model(str(run))
    for expected, got in zip(reference.weights, resumed.weights, strict=True):
        np.testing.assert_allclose(np.array(got), np.array(expected), atol=1e-5)
    index = run / "checkpoints" / "ckpt-4.index"
    garbled = bytearray(index.read_bytes())
    garbled[len(garbled) // 2 :] = bytes(len(garbled) - len(garbled) // 2)
    index.write_bytes(bytes(garbled))
    with pytest.raises(ValueError, match="ckpt-4 is damaged"):
        restore_model(str(run))

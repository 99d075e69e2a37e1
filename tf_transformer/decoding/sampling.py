"""Sampling: each next token drawn from the model's distribution, for back-translation and data augmentation.

Edunov et al. (2018) found back-translations sampled from the model train a
better forward model than beam search's, which are too regular; fairseq
(``--sampling``), OpenNMT-tf (``sampling_topk``) and CTranslate2
(``sampling_topk``/``sampling_topp``) sample as here. The distribution is the
model's next-token log-probabilities divided by a ``temperature``, cut to its
``top_k`` most probable tokens and then to the fewest whose probability sums to
at least ``top_p`` (nucleus sampling, Holtzman et al., 2020), and renormalized.

Draws are seeded and stateless (``tf.random.stateless_categorical`` with the
seed ``[seed, step]``): the same seed and the same batch give the same outputs
in any process on one machine and TensorFlow build (another CPU's kernels may
round a log-probability differently, and so draw another token). A draw depends on its row's place in the
batch and on the batch's shape, as every stateless draw does: the same
sentences batched differently are other draws.
"""

from __future__ import annotations

import tensorflow as tf

from tf_transformer.decoding.beam_search import NEG_INF
from tf_transformer.decoding.greedy import single_search


def filter_log_probs(log_probs, temperature=1.0, top_k=0, top_p=1.0):
    """``log_probs`` ``float32[batch, vocab]`` tempered and cut to top-k, then top-p; cut tokens ``NEG_INF``.

    ``top_k`` 0 keeps every token; ``top_p`` 1 keeps every token. Top-p keeps the
    most probable tokens up to and including the first at which the (tempered,
    top-k) probabilities sum to ``top_p``, so at least one token is always kept.
    The result is unnormalized (what a categorical draw takes). Tokens already
    at ``NEG_INF`` (PAD, BOS, an early EOS, what a constraint refuses) stay there
    whatever the temperature: divided by a large one they would come within
    reach. The log-probabilities are shifted so that the most probable is 0
    before dividing, so that a small temperature cannot push every token past
    ``NEG_INF`` (or float32's range) either.
    """
    banned = log_probs <= NEG_INF / 2  # [batch, vocab]
    best = tf.reduce_max(log_probs, axis=-1, keepdims=True)  # [batch, 1]
    logits = tf.where(banned, NEG_INF, (log_probs - best) / tf.cast(temperature, tf.float32))  # [batch, vocab]
    vocab = tf.shape(logits)[-1]
    k = tf.where(top_k > 0, tf.minimum(top_k, vocab), vocab)

    def cut_to_top_k():
        kth = tf.math.top_k(logits, k=k).values[:, -1:]  # [batch, 1]
        return tf.where(logits < kth, NEG_INF, logits)

    logits = tf.cond(k < vocab, cut_to_top_k, lambda: logits)

    def cut_to_top_p():
        ordered = tf.sort(logits, axis=-1, direction="DESCENDING")  # [batch, vocab]
        probs = tf.nn.softmax(ordered, axis=-1)
        before = tf.cumsum(probs, axis=-1, exclusive=True)  # [batch, vocab]: mass of the more probable tokens
        kept = tf.reduce_sum(tf.cast(before < tf.cast(top_p, tf.float32), tf.int32), axis=-1)  # [batch], ≥ 1
        least = tf.gather(ordered, tf.maximum(kept, 1) - 1, batch_dims=1)[:, None]  # [batch, 1]
        return tf.where(logits < least, NEG_INF, logits)

    return tf.cond(tf.cast(top_p, tf.float32) < 1.0, cut_to_top_p, lambda: logits)


def sample_search(
    model,
    inputs,
    seed,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    max_extra_length=50,
    max_output_length: int | None = None,
    min_length=2,
    decoding=None,
    weights=None,
    constraint=None,
):
    """One sampled output per row of ``inputs`` (``int32[batch, src_len]``, EOS-terminated, 0-padded).

    ``seed``: an integer (or ``int32``/``int64`` scalar tensor); see the module
    for what it makes reproducible. ``temperature``, ``top_k``, ``top_p``: see
    :func:`filter_log_probs` (scalars or scalar tensors). Lengths as
    :func:`~tf_transformer.decoding.greedy.single_search`, as are ``decoding``, ``weights`` and
    ``constraint`` (draws among the tokens it allows).

    Returns ``(ids int32[batch, out_len], log_probs float32[batch])``: the
    outputs (EOS-terminated, 0-padded) and their log-probabilities under the
    model itself (temperature 1, nothing cut), e.g. to filter back-translations.
    """
    seed = tf.cast(seed, tf.int64)

    def draw(log_probs, step):
        logits = filter_log_probs(log_probs, temperature, top_k, top_p)  # [batch, vocab]
        pair = tf.stack([seed, tf.cast(step, tf.int64)])  # [2]: one stream per step
        return tf.random.stateless_categorical(logits, 1, seed=pair, dtype=tf.int32)[:, 0]  # [batch]

    return single_search(
        model,
        inputs,
        draw,
        max_extra_length,
        max_output_length,
        min_length,
        decoding,
        weights,
        constraint=constraint,
    )

"""Dev-set evaluation during training: the task's score by greedy search each epoch (BLEU for translation,
F1 for parsing), sample outputs, attention images.

Greedy search over the decoding cache (:mod:`tf_transformer.decoding`), so
the dev score each epoch costs seconds; the beam search of the paper (sections
6.1, 6.3) is for evaluation after training (``tft-evaluate``).
"""

from __future__ import annotations

import keras
import tensorflow as tf
from absl import logging

import pipelines
from tf_transformer.attention_views.figures import head_grid, png_bytes
from tf_transformer.attention_views.maps import AttentionMaps, attention_maps, hypothesis_length, penultimate
from tf_transformer.constants import EOS_ID
from tf_transformer.decoding import IncrementalDecoder, greedy_search
from tf_transformer.decoding.tree_constraint import tree_constraint


def _greedy(model, max_extra_length: int, constraint=None):
    """``ids int32[batch, src_len] → int32[batch, out_len]`` by greedy search over the decoding cache."""
    decoding = IncrementalDecoder(model)
    return tf.function(
        lambda ids: greedy_search(
            model, ids, max_extra_length=max_extra_length, decoding=decoding, constraint=constraint
        ),
        reduce_retracing=True,
    )


def translate_fn(model, tokenizer, max_extra_length: int = 50, batch_tokens: int = 4096, tree: str | None = None):
    """A function translating a list of strings by greedy search (dev BLEU during training).

    Greedy search over the decoding cache, so dev BLEU each epoch costs seconds. ``tree``: a
    parser's linearization, whose well-formed trees the outputs are kept to (as after training,
    :class:`~tf_transformer.decoding.decode_options.DecodeOptions`' ``tree``).
    """
    decode = _greedy(model, max_extra_length, tree_constraint(tokenizer, tree, model.config.vocab_size))

    def translate(sources: list[str]) -> list[str]:
        batches = list(pipelines.decoding_dataset(sources, tokenizer, tokens_per_batch=batch_tokens))
        outputs = [tokenizer.detokenize_target(decode(b["inputs"])).numpy() for b in batches]
        restored = pipelines.restore_order([b["index"].numpy() for b in batches], outputs, len(sources))
        return [text.decode("utf-8") for text in restored]

    return translate


def attention_fn(model, tokenizer, max_extra_length: int = 50, tree: str | None = None):
    """A function from a list of strings to their :class:`~tf_transformer.attention_views.maps.AttentionMaps`.

    Each sentence is translated greedily, as dev BLEU is, then the model runs
    teacher-forced over its translation and keeps every layer's attention (the
    TensorBoard images of :class:`DevEvaluation`).
    """
    decode = _greedy(model, max_extra_length, tree_constraint(tokenizer, tree, model.config.vocab_size))
    processor = tokenizer.python_processor()  # the pieces of the graph tokenizer's ids

    def maps(sources: list[str]) -> list[AttentionMaps]:
        found = []
        for source in sources:
            ids = [*tokenizer.encode(source.strip()), EOS_ID]
            output = decode(tf.constant([ids], tf.int32))[0].numpy()
            target = output[: hypothesis_length(output)]
            found.append(attention_maps(model, ids, target, processor.id_to_piece))
        return found

    return maps


class DevEvaluation(keras.callbacks.Callback):
    """Per epoch: the task's score on a dev subset (``val_bleu`` or ``val_f1`` in the epoch's logs), a few
    sample outputs as text and images of their attention, in TensorBoard.

    ``translate`` maps a list of source strings to raw outputs (:func:`translate_fn`);
    ``task`` scores them (:meth:`~tf_transformer.tasks.Task.score`: sacreBLEU on
    detokenized, cased text; EVALB F1 of repaired trees) and shows them
    (:meth:`~tf_transformer.tasks.Task.postprocess`). ``attention`` maps a list of
    source strings to their :class:`~tf_transformer.attention_views.maps.AttentionMaps`
    (:func:`attention_fn`):
    the first ``attention_images`` dev sentences are drawn each epoch, their
    encoder–decoder attention per layer (heads averaged) and the encoder
    self-attention of the penultimate layer per head, which the paper's figures 3–5 show.
    """

    def __init__(
        self,
        log_dir: str,
        task=None,
        dev_sources=(),
        dev_references=(),
        translate=None,
        attention=None,
        attention_images: int = 3,
    ):
        super().__init__()
        if task is None:
            from tf_transformer.tasks import get_task

            task = get_task("translation")
        self.task = task
        self.attention = attention
        self.attention_images = attention_images
        self.validation_writer = tf.summary.create_file_writer(f"{log_dir}/validation")
        self.dev_sources = list(dev_sources)
        self.dev_references = list(dev_references)
        self.translate = translate
        self.last_score = None

    def on_epoch_end(self, epoch, logs=None):
        if not (self.translate and self.dev_sources):
            return
        outputs = self.translate(self.dev_sources)
        scores = self.task.score(self.dev_sources, outputs, self.dev_references)
        metric = self.task.metric
        self.last_score = scores[metric]
        if logs is not None:
            logs[f"val_{metric}"] = scores[metric]
        step = int(self.model.optimizer.iterations.numpy())
        samples = "\n\n".join(
            f"**source:** {s}  \n**reference:** {r if isinstance(r, str) else ' '.join(str(r).split())}  \n"
            f"**output:** {self.task.postprocess(s, h)}"
            for s, r, h in list(zip(self.dev_sources, self.dev_references, outputs, strict=True))[:4]
        )
        with self.validation_writer.as_default(step=step):
            for name, value in scores.items():
                if isinstance(value, int | float) and name not in ("sentences",):
                    tf.summary.scalar(name, value)
            tf.summary.text("sample_translations", samples)
        logging.info("epoch %d step %d: dev-subset %s %.2f", epoch + 1, step, metric.upper(), scores[metric])
        if self.attention is not None and self.attention_images:
            self._attention_images(step)

    def _attention_images(self, step: int) -> None:
        """Images of the attention of the first ``attention_images`` dev sentences (see the class)."""
        sentences = self.dev_sources[: self.attention_images]
        for number, maps in enumerate(self.attention(sentences), start=1):
            layers = maps.cross.shape[0]
            layer = penultimate(layers)
            cross = head_grid(
                maps.cross.mean(axis=1),  # [layers, target, source]: heads averaged
                maps.target,
                maps.source,
                f"encoder-decoder attention, heads averaged (rows: target token predicted)\n{sentences[number - 1]}",
                columns=layers,
                panel_titles=[f"layer {index + 1}" for index in range(layers)],
            )
            encoder = head_grid(
                maps.encoder[layer],  # [heads, source, source]
                maps.source,
                maps.source,
                f"encoder self-attention, layer {layer + 1} of {layers}\n{sentences[number - 1]}",
            )
            with self.validation_writer.as_default(step=step):
                for name, figure in (("encoder_decoder", cross), (f"encoder_self_layer{layer + 1}", encoder)):
                    image = tf.io.decode_png(png_bytes(figure), channels=4)[None]  # [1, height, width, 4]
                    tf.summary.image(f"attention/{name}/sentence_{number}", image)

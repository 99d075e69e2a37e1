"""Translating lists of sentences with an export (SavedModel) or a training run's checkpoint."""

from __future__ import annotations


def translate_lines(model_path: str, lines: list[str], batch_size: int = 64, progress=None) -> list[tuple[str, float]]:
    """Translations and scores of ``lines`` (in order) with the SavedModel at ``model_path``."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    serving = tf.saved_model.load(model_path).signatures["serving_default"]
    order = sorted(range(len(lines)), key=lambda i: len(lines[i]))
    results: list[tuple[str, float] | None] = [None] * len(lines)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        outputs = serving(inputs=tf.constant([lines[i] for i in batch]))
        for index, text, score in zip(batch, outputs["translations"].numpy(), outputs["scores"].numpy(), strict=True):
            results[index] = (text.decode("utf-8"), float(score))
        if progress:
            progress(min(start + batch_size, len(lines)), len(lines))
    return results


def translate_with_checkpoint(
    model_dir, lines, batch_size, beam_size, alpha, nbest, progress=None, checkpoint=None, streams=1
):
    """n-best ``[(text, score), …]`` per line from a run's checkpoint, any beam size and α.

    ``checkpoint`` is a checkpoint prefix; by default the averaged one when it exists, else the newest.
    ``streams``: see :class:`~tf_transformer.translator.Translator`.
    """
    import tensorflow as tf

    from pipelines import Tokenizer
    from tf_transformer.export import default_checkpoint
    from tf_transformer.training.trainer import restore_model
    from tf_transformer.translator import Translator

    model, config = restore_model(model_dir, checkpoint or default_checkpoint(model_dir))
    beam_size = beam_size or config.beam_size
    if nbest > beam_size:
        raise ValueError(f"--nbest {nbest} exceeds --beam_size {beam_size}")
    translator = Translator(
        model,
        Tokenizer(f"{model_dir}/sp.model"),
        beam_size=beam_size,
        alpha=config.length_penalty if alpha is None else alpha,
        extra_length=config.extra_decode_length,
        streams=streams,
    )
    run = tf.function(lambda texts: translator.translate(texts, nbest=nbest), reduce_retracing=True)
    order = sorted(range(len(lines)), key=lambda i: len(lines[i]))
    results = [None] * len(lines)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        outputs = run(tf.constant([lines[i] for i in batch]))
        texts = outputs["translations"].numpy().reshape(len(batch), nbest)
        scores = outputs["scores"].numpy().reshape(len(batch), nbest)
        for row, index in enumerate(batch):
            results[index] = [(t.decode("utf-8"), float(s)) for t, s in zip(texts[row], scores[row], strict=True)]
        if progress:
            progress(min(start + batch_size, len(lines)), len(lines))
    return results

"""Translating sentences with an export (SavedModel) or a training run's checkpoint: lists, or streams in chunks."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator

from configs.decoding import SETTINGS
from tf_transformer.decoding.decode_options import DecodeOptions
from tf_transformer.decoding.request import DecodeRequest


def export_translate(
    model_path: str, request: DecodeRequest | None = None, alignment: bool = False, tokenized: bool = False
) -> Callable[[list], list]:
    """``translate(batch of lines) → [(translation, score), …]`` with the SavedModel at ``model_path``.

    ``request`` (:class:`~tf_transformer.decoding.request.DecodeRequest`): any
    setting it makes (n-best, beam, α, lengths, target prefixes: each line a
    ``(source, prefix)`` pair) uses the ``translate_with_options`` signature and
    gives n-best lists; sampling uses ``sample``. It is checked against the
    export's recorded options first: a ``RequestError`` (a ``ValueError``) names
    the setting. ``alignment``: ``(translation, score, "i-j …")`` from the export's
    ``translate_with_alignment`` signature (a ``ValueError`` if it has none).
    ``tokenized``: the lines are split into words already; an export that splits raw
    text (a parser's) then decodes them with its ``translate_tokens`` signature.
    """
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    from tf_transformer.exporting.export_info import TOKENS_SIGNATURE, read_export_info

    request = request or DecodeRequest()
    signatures = tf.saved_model.load(model_path).signatures
    recorded = read_export_info(model_path).options
    splits = tokenized and recorded.word_tokenizer is not None
    if splits and (alignment or not request.is_default()):
        raise ValueError(
            f"{model_path} splits raw text into words ({recorded.word_tokenizer}) in every signature but "
            f"{TOKENS_SIGNATURE}, which takes no request options: send raw text, or decode with the run directory"
        )
    if request.sampling is not None:
        name = "sample"
    elif not request.is_default():
        name = "translate_with_options"
    else:
        name = "translate_with_alignment" if alignment else TOKENS_SIGNATURE if splits else "serving_default"
    if name not in signatures:
        raise ValueError(f"{model_path} has no {name} signature: export it again with this version's tft-export")
    serving = signatures[name]
    scalars = {}
    if name not in ("serving_default", "translate_with_alignment", TOKENS_SIGNATURE):
        request.check(recorded)
        scalars = {key: tf.constant(value, SETTINGS[key].dtype) for key, value in request.values(recorded).items()}

    def translate(batch):
        sources = [source_of(item) for item in batch]
        if name == "sample":
            seed = tf.constant(request.sampling.batch_seed(sources), tf.int64)
            outputs = serving(inputs=tf.constant(sources), **{**scalars, "seed": seed})
        elif name == "translate_with_options":
            prefixes = [item[1] for item in batch] if request.prefix else [""] * len(batch)
            outputs = serving(inputs=tf.constant(sources), target_prefix=tf.constant(prefixes), **scalars)
            texts, scores = outputs["translations"].numpy(), outputs["scores"].numpy()  # [batch, nbest]
            return [[_row(values) for values in zip(texts[row], scores[row], strict=True)] for row in range(len(batch))]
        else:
            outputs = serving(inputs=tf.constant(sources))
        columns = [outputs["translations"].numpy(), outputs["scores"].numpy()]
        if alignment:
            columns.append(outputs["alignments"].numpy())
        return [_row(values) for values in zip(*columns, strict=True)]

    return translate


def _row(values) -> tuple:
    """``(text, score[, alignment])`` from a signature's outputs for one sentence."""
    text, score, *rest = values
    return (text.decode("utf-8"), float(score), *(value.decode("utf-8") for value in rest))


def source_of(line) -> str:
    """A line's source: the line, or the first of a ``(source, target prefix)`` pair."""
    return line if isinstance(line, str) else line[0]


def with_prefixes(lines: Iterable[str], path: str) -> Iterator[tuple[str, str]]:
    """``(source, target prefix)`` pairs of ``lines`` and the lines of the file at ``path``, read as they go.

    A :class:`~pipelines.DataError` names the file when it cannot be read or
    when its line count is not the input's (found when the shorter one ends).
    """
    from pipelines import DataError, split_lines

    try:
        handle = open(path, "rb")  # noqa: SIM115 (read line by line, as the sources are)
    except OSError as error:
        raise DataError(f"--target_prefix {path}: {error.strerror}") from None
    with handle:
        prefixes = split_lines(handle, path)
        count = 0
        for source in lines:
            prefix = next(prefixes, None)
            if prefix is None:
                raise DataError(f"{path} has {count} lines, fewer than the input: one prefix per input line")
            count += 1
            yield source, prefix
        if next(prefixes, None) is not None:
            raise DataError(f"{path} has more lines than the input ({count}): one prefix per input line")


def checked_sources(lines: Iterable[str], model_path: str, name: str, tokenized: bool = False) -> Iterator[str]:
    """``lines``, each checked against the export's maximum source length as it is read.

    A line over it raises :class:`~pipelines.DataError` naming ``name`` and the
    line, instead of the whole batch failing inside the graph with no line named.
    """
    from pipelines import DataError
    from tf_transformer.exporting.export_info import SourceLimit

    limits = SourceLimit(model_path, tokenized)
    for number, line in enumerate(lines, start=1):
        if (why := limits.violation(source_of(line))) is not None:
            raise DataError(f"{name}:{number}: {why}")
        yield line


def translate_lines(
    model_path: str, lines: list[str], batch_size: int = 64, progress=None, workers: int = 1, tokenized: bool = False
) -> list[tuple[str, float]]:
    """Translations and scores of ``lines`` (in order) with the SavedModel at ``model_path``.

    ``workers``: batches decoded at once, each by its own call of the signature
    (as TF Serving runs concurrent requests); see :func:`_translate_batches`.
    ``tokenized``: see :func:`export_translate`.
    """
    translate = export_translate(model_path, tokenized=tokenized)
    return _translate_batches(lines, batch_size, translate, workers, progress)


def translate_stream(
    translate: Callable[[list[str]], list],
    lines: Iterable[str],
    batch_size: int = 64,
    chunk_size: int = 10_000,
    workers: int = 1,
    progress=None,
) -> Iterator:
    """``translate``'s result for each of ``lines``, in input order, as soon as its chunk is done.

    ``lines`` is read ``chunk_size`` lines at a time, and each chunk is batched
    by length and translated (:func:`_translate_batches`) before the next is
    read: memory holds one chunk whatever the input's length, and what is
    translated is out before a later line can fail. Batches pad less the larger
    the chunk. ``progress(done, None)`` after each batch.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    lines, done = iter(lines), 0
    while chunk := list(itertools.islice(lines, chunk_size)):
        report = None if progress is None else (lambda n, _, base=done: progress(base + n, None))
        yield from _translate_batches(chunk, batch_size, translate, workers, report)
        done += len(chunk)


def _translate_batches(lines, batch_size, translate, workers, progress):
    """``translate(batch of lines) → one result per line`` over ``lines`` batched by length; results in input order.

    Lines are sorted by length so that a batch pads little. With ``workers`` > 1,
    that many batches are translated at once on a thread pool (TensorFlow
    releases the GIL while a graph runs). On a CPU, ``workers`` batches with an
    intra-op pool of ``cores / workers`` threads can decode faster than one batch at a time
    on all cores: a decoding step is hundreds of small ops, and each then runs
    whole on one core instead of being split across the cores (docs/design/decoding.md).
    """
    from concurrent.futures import ThreadPoolExecutor

    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    order = sorted(range(len(lines)), key=lambda i: len(source_of(lines[i])))
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    results = [None] * len(lines)
    done = 0
    with ThreadPoolExecutor(workers) as pool:
        run = map if workers == 1 else pool.map  # one worker: batch after batch on the calling thread
        translated = run(lambda batch: translate([lines[i] for i in batch]), batches)
        for batch, outputs in zip(batches, translated, strict=True):  # in the batches' order
            for index, result in zip(batch, outputs, strict=True):
                results[index] = result
            done += len(batch)
            if progress:
                progress(done, len(lines))
    return results


def translate_with_checkpoint(
    model_dir,
    lines,
    batch_size,
    request: DecodeRequest | None = None,
    options: DecodeOptions | None = None,
    progress=None,
    checkpoint=None,
    workers=1,
):
    """n-best ``[(text, score), …]`` per line from a run's checkpoint (:func:`checkpoint_translate`).

    ``workers``: see :func:`_translate_batches`.
    """
    translate = checkpoint_translate(model_dir, request, options, checkpoint)
    return _translate_batches(lines, batch_size, translate, workers, progress)


def checkpoint_translate(
    model_dir, request: DecodeRequest | None = None, options: DecodeOptions | None = None, checkpoint=None
) -> Callable[[list], list]:
    """``translate(batch of lines) → n-best [(text, score), …] per line`` with a run's checkpoint.

    ``request`` (:class:`~tf_transformer.decoding.request.DecodeRequest`): any
    beam size, α and lengths (the translator is built for them), n-best, target
    prefixes (each line a ``(source, prefix)`` pair); with sampling, one sampled
    ``(text, score)`` per line. ``options``: the translator's other options
    (batch parts, limits; by default the run's); ``checkpoint`` is a checkpoint
    prefix, by default :func:`~tf_transformer.run_dir.default_checkpoint`.
    A ``RequestError`` (a ``ValueError``) names a setting out of range.
    """
    import tensorflow as tf

    from tf_transformer.inference.translator import Translator
    from tf_transformer.run_dir import restore_model
    from tf_transformer.tasks import run_tokenizer

    request = request or DecodeRequest()
    model, config = restore_model(model_dir, checkpoint)
    options = (options or DecodeOptions.for_run(model_dir)).merged(request)
    request.check(options, compiled_beams=False)
    translator = Translator(model, run_tokenizer(model_dir), options)
    if request.sampling is not None:
        run = tf.function(
            lambda texts, seed: translator.sample(
                texts, request.replace(sampling=dataclasses.replace(request.sampling, seed=seed))
            ),
            reduce_retracing=True,
        )

        def sample(batch):
            outputs = run(tf.constant(batch), tf.constant(request.sampling.batch_seed(batch), tf.int64))
            return [
                _row(values) for values in zip(outputs["translations"].numpy(), outputs["scores"].numpy(), strict=True)
            ]

        return sample
    nbest = request.nbest
    if request.prefix:
        run = tf.function(lambda texts, prefixes: translator.translate(texts, request, prefixes), reduce_retracing=True)
    else:
        translate_texts = tf.function(lambda texts: translator.translate(texts, request), reduce_retracing=True)
        run = lambda texts, prefixes: translate_texts(texts)  # noqa: E731

    def translate(batch):
        sources = [source_of(item) for item in batch]
        prefixes = tf.constant([item[1] for item in batch]) if request.prefix else None
        outputs = run(tf.constant(sources), prefixes)
        texts = outputs["translations"].numpy().reshape(len(batch), nbest)
        scores = outputs["scores"].numpy().reshape(len(batch), nbest)
        return [
            [(t.decode("utf-8"), float(s)) for t, s in zip(texts[row], scores[row], strict=True)]
            for row in range(len(batch))
        ]

    return translate


def postprocessed(
    translate: Callable[[list[str]], list], postprocess: Callable[[str, str], str]
) -> Callable[[list[str]], list]:
    """``translate`` with each output text passed through ``postprocess(source, text)`` (a task's: a parser's
    repair). Results keep their shape: ``(text, score, …)`` tuples, or n-best lists of them."""

    def run(batch: list) -> list:
        results = translate(batch)
        return [
            [(postprocess(source_of(line), text), *rest) for text, *rest in result]
            if isinstance(result, list)
            else (postprocess(source_of(line), result[0]), *result[1:])
            for line, result in zip(batch, results, strict=True)
        ]

    return run

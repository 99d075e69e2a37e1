"""Runs every signature of an export through the session-based loader, as TF Serving does.

Meant for a second environment holding the TensorFlow and TensorFlow Text that
TF Serving's official builds embed (2.12.1 each; ``make serving-venv`` builds
it), so that it checks the export's ops against that op set. It is a stand-in:
TF 2.12's Python session loader, not TF Serving's binary, which cannot be
installed here. It imports nothing from this project.

    .venv-tf212/bin/python tests/exporting/session_loader_check.py EXPORT '{"strings": ["a b"], "ids": [[9, 3]]}'

Each signature is fed by its SignatureDef's tensor names: an input named in
``named`` gets that value (the scalar settings of ``translate_with_options`` and
``sample``), any other string input ``strings``, an integer input ``ids``. ``--without_tf_text`` loads without
importing tensorflow_text (for an ``--ids_only`` export, which must not need
it). Prints one JSON object: the TensorFlow version, each signature's outputs,
and the records of the export's warmup file as this TensorFlow's TFRecord reader
counts them (``None``: no file). This environment has no TF Serving protos to
parse the records with.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np


def _jsonable(value):
    """An output as JSON values, strings (at any depth) decoded from UTF-8."""

    def decoded(item):
        if isinstance(item, list):
            return [decoded(v) for v in item]
        return item.decode("utf-8") if isinstance(item, bytes) else item

    return decoded(np.asarray(value).tolist())


def run_signatures(export: str, inputs: dict) -> dict:
    """``{signature: {output: value}}`` for every signature of ``export`` but the loader's own."""
    import tensorflow as tf

    results = {}
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], export)
        for name, signature in sorted(meta.signature_def.items()):
            if name == "__saved_model_init_op":
                continue
            feed = {}
            for key, tensor in signature.inputs.items():
                if key in inputs.get("named", {}):
                    feed[tensor.name] = inputs["named"][key]
                    continue
                kind = "strings" if tensor.dtype == tf.string.as_datatype_enum else "ids"
                if kind not in inputs:
                    raise SystemExit(f"signature {name!r} input {key!r} needs {kind!r} in the inputs")
                feed[tensor.name] = inputs[kind]
            fetches = {key: tensor.name for key, tensor in signature.outputs.items()}
            results[name] = {key: _jsonable(value) for key, value in session.run(fetches, feed).items()}
    return results


def warmup_records(export: str) -> int | None:
    """How many records the export's ``assets.extra/tf_serving_warmup_requests`` holds (``None``: no file)."""
    import tensorflow as tf

    path = os.path.join(export, "assets.extra", "tf_serving_warmup_requests")
    if not os.path.exists(path):
        return None
    return sum(1 for _ in tf.compat.v1.io.tf_record_iterator(path))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("export", help="an export's version directory")
    parser.add_argument("inputs", help='JSON: {"strings": [...], "ids": [[...], ...], "named": {name: value}}')
    parser.add_argument("--without_tf_text", action="store_true", help="do not import tensorflow_text")
    args = parser.parse_args()
    import tensorflow as tf

    if not args.without_tf_text:
        import tensorflow_text  # noqa: F401  (registers the SentencePiece ops, as TF Serving links them in)
    results = run_signatures(args.export, json.loads(args.inputs))
    warmup = warmup_records(args.export)
    print(json.dumps({"tensorflow": tf.__version__, "signatures": results, "warmup_records": warmup}))


if __name__ == "__main__":
    main()

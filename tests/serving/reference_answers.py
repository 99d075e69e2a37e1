"""TF Serving's JSON answer built the plain way: the oracle ``encode_response`` is compared with.

``encode_response`` writes its answer a sentence at a time to stop early at the
size limit; this builds the whole answer as Python values with numpy's own
``tolist`` and lets ``json.dumps`` write it.
"""

import numpy as np


def _plain(value):
    """A numpy value as JSON values: arrays as lists, numbers as Python's, bytes decoded from UTF-8."""
    if isinstance(value, np.ndarray | np.generic):
        value = value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def response(request, outputs: dict) -> dict:
    """TF Serving's answer to ``request`` (a ``PredictRequest``) for ``outputs`` (first axis: sentences)."""
    sentences = range(len(request.rows))
    columns = {key: [_plain(value[i]) for i in sentences] for key, value in outputs.items()}
    if request.row_format:
        return {"predictions": [{key: column[i] for key, column in columns.items()} for i in sentences]}
    return {"outputs": columns}

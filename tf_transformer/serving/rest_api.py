"""TF Serving's REST API bodies: a predict request's JSON parsed and checked, its answer encoded.

A request is JSON in one of TF Serving's two formats: the row format
``{"instances": [...]}`` answered ``{"predictions": [{output: value}, ...]}``, or
the columnar format ``{"inputs": [...]}`` answered ``{"outputs": {output: [...]}}``
(https://www.tensorflow.org/tfx/serving/api_rest). Every mistake a client can
make is a :class:`ClientError` carrying the HTTP status to answer with, so that a
client's mistake never surfaces as a server error (500).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

INT32_MAX = 2**31 - 1
INT_BITS = {"int32": 32, "int64": 64}  # the integer kinds of a scalar input (parse_predict)


class ClientError(ValueError):
    """A request the server refuses; ``status`` is the HTTP status code (4xx, or 503 when busy)."""

    status = 400

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        if status is not None:
            self.status = status


class NotFound(ClientError):
    status = 404


class Unavailable(ClientError):
    """The server cannot take the request now (no model loaded, queue full, stopping)."""

    status = 503


class QueueFull(Unavailable):
    """The batching queue holds all it may: retry later (gRPC's ``RESOURCE_EXHAUSTED``)."""


@dataclasses.dataclass(frozen=True)
class PredictRequest:
    """A checked predict request: ``rows`` of the signature's ``inputs``, and its other inputs if it has any.

    ``columns``: the signature's other per-sentence inputs (strings), by name,
    each as long as ``rows``; ``scalars``: its scalar inputs (settings of the
    request, e.g. ``beam_size``), by name. Both are empty for a signature whose
    only input is ``inputs``.
    """

    signature: str
    rows: list  # str per sentence, or list[int] of token ids per sentence
    row_format: bool  # "instances" (answer "predictions") or "inputs" (answer "outputs")
    columns: dict = dataclasses.field(default_factory=dict)
    scalars: dict = dataclasses.field(default_factory=dict)


def parse_json(raw: bytes):
    """The request body as JSON, or a :class:`ClientError` saying what is wrong with it."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ClientError(f"Request body is not UTF-8: {error}") from None
    except json.JSONDecodeError as error:
        raise ClientError(f"Malformed JSON: {error}") from None
    except RecursionError:
        raise ClientError("Malformed JSON: nested too deeply") from None
    except ValueError as error:  # an integer literal of over 4,300 digits (Python's int() limit since 3.11)
        raise ClientError(f"Malformed JSON: {str(error).split(';')[0]}") from None


def parse_predict(body, input_kinds: dict[str, str | dict[str, str]], max_batch_size: int) -> PredictRequest:
    """Checks a predict request's JSON against the model's signatures.

    Args:
      body: the parsed JSON.
      input_kinds: signature name → ``"strings"`` (one string per sentence) or
        ``"ids"`` (one list of token ids per sentence) for a signature whose only
        input is ``inputs``; for one with more inputs, input name → ``"strings"``
        (one per sentence), ``"int32"``, ``"int64"`` or ``"float"`` (a scalar per request).
      max_batch_size: the most sentences one request may carry.
    """
    if not isinstance(body, dict):
        raise ClientError("Request body must be a JSON object")
    name = body.get("signature_name", "serving_default")
    if not isinstance(name, str) or name not in input_kinds:
        raise ClientError(f"Unknown signature_name {name!r}; available: {sorted(input_kinds)}")
    row_format = "instances" in body
    if row_format == ("inputs" in body):
        raise ClientError("Request must have exactly one of 'instances' (row format) or 'inputs' (columnar format)")
    if isinstance(input_kinds[name], dict):
        return _parse_several(name, body, input_kinds[name], row_format, max_batch_size)
    values = body["instances"] if row_format else body["inputs"]
    if isinstance(values, dict):  # {"inputs": {"inputs": [...]}} names the signature's input
        if set(values) != {"inputs"}:
            raise ClientError(f"The signature's only input is 'inputs', got {sorted(values)}")
        values = values["inputs"]
    if row_format and isinstance(values, list):  # [{"inputs": ...}, ...] names it per instance
        if any(isinstance(row, dict) and set(row) != {"inputs"} for row in values):
            raise ClientError("Each instance object must hold exactly the key 'inputs'")
        values = [row["inputs"] if isinstance(row, dict) else row for row in values]
    if not isinstance(values, list) or not values:
        raise ClientError("Inputs must be a non-empty list")
    if len(values) > max_batch_size:
        raise ClientError(f"Batch of {len(values)} sentences exceeds the maximum of {max_batch_size}")
    if input_kinds[name] == "strings":
        _check_strings(name, "input", values)
    else:
        for index, row in enumerate(values):
            if not isinstance(row, list) or not row or not all(_is_int(i) for i in row):
                raise ClientError(f"{name} takes non-empty lists of integer token ids; input {index} is not one")
            if not all(-INT32_MAX - 1 <= i <= INT32_MAX for i in row):
                raise ClientError(f"{name}: input {index} holds an id outside int32")
    return PredictRequest(name, values, row_format)


def _check_strings(signature: str, what: str, values: list) -> None:
    """Every one of ``values`` a string that UTF-8 can encode, or a :class:`ClientError` naming it."""
    for index, value in enumerate(values):
        if not isinstance(value, str):
            raise ClientError(f"{signature} takes strings; {what} {index} is {_kind(value)}")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:  # JSON allows lone surrogates ("\ud800"); UTF-8 does not
            raise ClientError(f"{what} {index} is not valid Unicode: {error.reason} at {error.start}") from None


def _parse_several(name: str, body: dict, kinds: dict[str, str], row_format: bool, max_batch_size: int):
    """A request of a signature with several inputs (``kinds``: input name → kind; see :func:`parse_predict`).

    Scalars have no sentence axis, so, as in TF Serving, only the columnar format
    can carry them: ``{"inputs": {"inputs": [...], "beam_size": 8, ...}}``.
    """
    per_row = sorted((key for key, kind in kinds.items() if kind == "strings"), key=lambda key: key != "inputs")
    scalars = sorted(key for key in kinds if key not in per_row)
    if row_format:
        if scalars:
            raise ClientError(
                f"{name} takes scalar inputs ({', '.join(scalars)}), which only TF Serving's columnar format "
                'carries: send {"inputs": {"inputs": [...], ...}} instead of "instances"'
            )
        instances = body["instances"]
        if not isinstance(instances, list) or not instances:
            raise ClientError("Inputs must be a non-empty list")
        if not all(isinstance(row, dict) and set(row) == set(per_row) for row in instances):
            raise ClientError(f"Each instance of {name} must be an object with exactly the keys {sorted(per_row)}")
        values = {key: [row[key] for row in instances] for key in per_row}
    else:
        values = body["inputs"]
        if not isinstance(values, dict) or set(values) != set(kinds):
            missing, extra = sorted(set(kinds) - set(values or {})), sorted(set(values or {}) - set(kinds))
            raise ClientError(
                f"{name} takes the named inputs {sorted(kinds)} as one object"
                + (f"; missing {missing}" if isinstance(values, dict) and missing else "")
                + (f"; unknown {extra}" if isinstance(values, dict) and extra else "")
            )
    count = None
    for key in per_row:
        column = values[key]
        if not isinstance(column, list) or not column:
            raise ClientError(f"{name}: input {key!r} must be a non-empty list")
        if count is not None and len(column) != count:
            raise ClientError(f"{name}: input {key!r} has {len(column)} entries but 'inputs' has {count}")
        count = len(column)
        _check_strings(name, f"{key} entry" if key != "inputs" else "input", column)
    if count > max_batch_size:
        raise ClientError(f"Batch of {count} sentences exceeds the maximum of {max_batch_size}")
    checked = {}
    for key in scalars:
        value = values[key]
        if kinds[key] in INT_BITS:
            bound = 2 ** (INT_BITS[kinds[key]] - 1)
            if not _is_int(value):
                raise ClientError(f"{name}: input {key!r} must be an integer, got {_kind(value)}")
            if not -bound <= value < bound:
                raise ClientError(f"{name}: input {key!r} is outside {kinds[key]}")
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise ClientError(f"{name}: input {key!r} must be a number, got {_kind(value)}")
        checked[key] = value
    columns = {key: values[key] for key in per_row if key != "inputs"}
    return PredictRequest(name, values["inputs"], row_format, columns, checked)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value) -> str:
    kinds = {dict: "an object", list: "a list", bool: "a boolean", type(None): "null", str: "a string"}
    return kinds.get(type(value), "a number")


def encode_response(request: PredictRequest, outputs: dict[str, np.ndarray], max_bytes: int) -> bytes:
    """TF Serving's JSON answer to ``request`` for the signature's ``outputs`` (first axis: sentences), as bytes.

    ``{"predictions": [{output: value}, ...]}`` in the row format,
    ``{"outputs": {output: [...]}}`` in the columnar one; refused (413) once it passes ``max_bytes``.

    Written one sentence's value at a time, so that an answer over the limit is
    given up before all of it is built: ``translate_with_alignment`` answers a
    ``[target, source]`` array of floats per sentence, hundreds of times the
    size of the request.
    """
    parts, size = [], 0

    def add(text: str) -> None:
        nonlocal size
        size += len(text)  # ASCII (json.dumps escapes the rest): one byte per character
        if size > max_bytes:
            raise ClientError(
                f"The answer is over this server's limit of {max_bytes} bytes (--max_response_bytes): "
                "send fewer or shorter sentences per request",
                413,
            )
        parts.append(text)

    keys = {key: json.dumps(key) for key in outputs}
    if request.row_format:
        add('{"predictions": [')
        for i in range(len(request.rows)):
            add(", {" if i else "{")
            for j, (key, value) in enumerate(outputs.items()):
                add((", " if j else "") + f"{keys[key]}: {json.dumps(_jsonable(value[i]))}")
            add("}")
        add("]}")
    else:
        add('{"outputs": {')
        for j, (key, value) in enumerate(outputs.items()):
            add((", " if j else "") + f"{keys[key]}: [")
            for i in range(len(request.rows)):
                add((", " if i else "") + json.dumps(_jsonable(value[i])))
            add("]")
        add("}}")
    return "".join(parts).encode()


def _jsonable(value):
    """A numpy array or scalar as JSON values: strings decoded from UTF-8, numbers as Python's."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray) and value.dtype == object:
        return [_jsonable(item) for item in value]
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    return value

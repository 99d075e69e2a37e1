"""One test routine every layer goes through (after keras-hub's ``run_layer_test``).

Checks: get_config → from_config round trip (and identical outputs with the same
weights), the number of weights, the eager and symbolic output shapes, one
jit-compiled ``fit`` step through the layer, and a forward pass under
``mixed_float16`` and ``mixed_bfloat16`` that stays finite and close to float32.
"""

from __future__ import annotations

import keras
import numpy as np


def _first(output):
    return output[0] if isinstance(output, (tuple, list)) else output


def _symbolic(value):
    if isinstance(value, np.ndarray):
        return keras.Input(shape=value.shape[1:], batch_size=value.shape[0], dtype=str(value.dtype))
    return value


def run_layer_test(
    layer_cls,
    init_kwargs: dict,
    call_args: tuple,
    call_kwargs: dict | None = None,
    expected_output_shape: tuple | None = None,
    expected_num_weights: int | None = None,
    mixed_precision_atol: float = 0.1,
    run_fit: bool = True,
):
    call_kwargs = dict(call_kwargs or {})
    layer = layer_cls(**init_kwargs)
    output = _first(layer(*call_args, **call_kwargs))

    # Config round trip: same config, and identical outputs with the same weights.
    config = layer.get_config()
    for key, value in init_kwargs.items():
        assert key in config, f"{layer_cls.__name__}.get_config() lacks {key!r}"
        assert config[key] == value, f"{layer_cls.__name__}.get_config()[{key!r}] = {config[key]!r} != {value!r}"
    clone = layer_cls.from_config(config)
    assert clone.get_config() == config
    clone(*call_args, **call_kwargs)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(
        np.asarray(_first(clone(*call_args, **call_kwargs))), np.asarray(output), rtol=1e-6, atol=1e-6
    )

    if expected_num_weights is not None:
        assert len(layer.weights) == expected_num_weights, [w.path for w in layer.weights]
    if expected_output_shape is not None:
        assert tuple(output.shape) == tuple(expected_output_shape)

    # Symbolic call (functional API) gives the same shape as the eager call.
    symbolic_args = [_symbolic(a) for a in call_args]
    symbolic_kwargs = {k: _symbolic(v) for k, v in call_kwargs.items()}
    fresh = layer_cls.from_config(config)
    symbolic_output = _first(fresh(*symbolic_args, **symbolic_kwargs))
    assert tuple(symbolic_output.shape) == tuple(output.shape)

    if run_fit and layer.trainable_weights:
        inputs = [a for a in symbolic_args if isinstance(a, keras.KerasTensor)]
        inputs += [v for v in symbolic_kwargs.values() if isinstance(v, keras.KerasTensor)]
        model = keras.Model(inputs, symbolic_output)
        model.compile(optimizer="adam", loss="mse", jit_compile=True)
        data = [a for a in call_args if isinstance(a, np.ndarray)]
        data += [v for v in call_kwargs.values() if isinstance(v, np.ndarray)]
        target = np.random.default_rng(0).normal(size=output.shape).astype("float32")
        before = [w.numpy().copy() for w in model.trainable_weights]
        history = model.fit(data, target, batch_size=output.shape[0], epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"][0])
        assert any(not np.array_equal(b, w.numpy()) for b, w in zip(before, model.trainable_weights, strict=True))

    for policy in ("mixed_float16", "mixed_bfloat16"):
        mixed = layer_cls.from_config({**config, "dtype": policy})
        mixed(*call_args, **call_kwargs)
        mixed.set_weights(layer.get_weights())
        mixed_output = np.asarray(_first(mixed(*call_args, **call_kwargs))).astype("float32")
        assert np.all(np.isfinite(mixed_output)), policy
        np.testing.assert_allclose(mixed_output, np.asarray(output), atol=mixed_precision_atol, err_msg=policy)
    return layer, output

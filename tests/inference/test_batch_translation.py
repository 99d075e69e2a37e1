"""Batch translation: lists of sentences in input order, batches side by side."""

import numpy as np
import pytest

from tf_transformer.inference.batch_translation import _translate_batches, translate_lines, translate_with_checkpoint


@pytest.mark.slow
def test_workers_translate_as_one_batch_at_a_time(tiny_run, tiny_export):
    """``workers=2``: two batches decoded at once, the same translations in input order (export and checkpoint)."""
    lines = ["zeta", "alpha beta gamma delta", "", "omega sigma", "alpha"]
    one = translate_lines(str(tiny_export), lines, batch_size=2)
    two = translate_lines(str(tiny_export), lines, batch_size=2, workers=2)
    assert [text for text, _ in two] == [text for text, _ in one] and one[2][0] == ""
    np.testing.assert_allclose([score for _, score in two], [score for _, score in one], atol=1e-5)
    single = translate_with_checkpoint(str(tiny_run), lines, 2)
    parallel = translate_with_checkpoint(str(tiny_run), lines, 2, workers=2)
    assert [hyps[0][0] for hyps in parallel] == [hyps[0][0] for hyps in single]
    with pytest.raises(ValueError, match="workers"):
        translate_lines(str(tiny_export), lines, workers=0)


@pytest.mark.parametrize("workers", [1, 3])
def test_batches_come_back_in_input_order_with_progress_and_errors(workers):
    """``_translate_batches`` with a stand-in translator whose batches finish out of order."""
    import random
    import time

    lines = [f"line {i} " + "x" * random.Random(i).randrange(20) for i in range(23)]

    def reverse(batch):
        time.sleep(random.random() * 0.01)  # batches finish in any order
        return [line[::-1] for line in batch]

    seen = []
    results = _translate_batches(lines, 4, reverse, workers, lambda done, total: seen.append((done, total)))
    assert results == [line[::-1] for line in lines]
    assert [done for done, _ in seen] == [4, 8, 12, 16, 20, 23] and {total for _, total in seen} == {23}
    assert _translate_batches([], 4, reverse, workers, None) == []

    def fail_on_long(batch):
        if any(len(line) > 25 for line in batch):
            raise RuntimeError("batch failed")
        return batch

    with pytest.raises(RuntimeError, match="batch failed"):
        _translate_batches(lines, 4, fail_on_long, workers, None)

"""pipelines/batching.py: buckets within the token budget and how one epoch's leftovers are merged."""

import pytest

from pipelines import make_buckets


def test_buckets_are_multiples_of_8_within_budget():
    buckets = make_buckets(max_length=100, tokens_per_batch=25_000, num_replicas=4)
    assert all(length % 8 == 0 for length in buckets.padded_lengths)
    assert buckets.padded_lengths[-1] >= 100
    for length, size in zip(buckets.padded_lengths, buckets.batch_sizes, strict=True):
        assert size % 4 == 0 and size * length <= 25_000
    with pytest.raises(ValueError, match="tokens_per_batch"):
        make_buckets(max_length=256, tokens_per_batch=300, num_replicas=2)


def test_epoch_plan_merges_the_leftovers_longest_first():
    buckets = make_buckets(max_length=16, tokens_per_batch=64)  # lengths 8 and 16: 8 and 4 rows a batch
    assert buckets.batch_sizes == (8, 4)
    plan = buckets.epoch_plan([3] * 10 + [12] * 5)
    # One full batch per bucket; the leftovers (1 long, 2 short rows) share a batch of the long bucket.
    assert (plan.full_batches, plan.partial_batches, plan.merged_rows, plan.batches) == (2, 2, (3,), 3)
    plan = buckets.epoch_plan([3] * 7 + [12] * 7)  # 3 long leftovers take 1 short row; 6 short rows remain
    assert plan.merged_rows == (4, 6)

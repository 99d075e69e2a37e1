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
    # 3 long and 7 short leftovers make 2 batches either as 4 + 6 rows (a short row padded to 16)
    # or as 3 + 7 (every row at its own bucket's length): the second pads less.
    plan = buckets.epoch_plan([3] * 7 + [12] * 7)
    assert plan.merged_rows == (3, 7)


def test_epoch_plan_packs_no_short_rows_under_long_ones_without_saving_a_batch():
    buckets = make_buckets(max_length=24, tokens_per_batch=48)  # lengths 8, 16, 24: 6, 3 and 2 rows a batch
    assert buckets.batch_sizes == (6, 3, 2)
    plan = buckets.epoch_plan([20] + [12] * 2 + [4] * 5)  # every row is a leftover
    # Three batches are the fewest. Filled to the brim, longest first, they are (24 16)(16 8 8)
    # (8 8 8): 120 padded tokens a side; (24)(16 16)(8 8 8 8 8) pads 96.
    assert (plan.full_batches, plan.partial_batches, plan.merged_rows) == (0, 3, (1, 2, 5))
    # Fewer batches come first: (24 16)(8 8) pads 64 where (24)(16)(8 8) would pad 56.
    assert buckets.epoch_plan([20, 12, 4, 4]).merged_rows == (2, 2)


@pytest.mark.parametrize("replicas", [1, 2, 4, 8])
def test_merged_batches_are_cut_at_multiples_of_8_rows_for_every_replica_count(replicas):
    """Keras ``fit`` and ``evaluate`` under ``MirroredStrategy`` average the replicas' parts of the first
    batch element by element, so a first batch of 5 rows on 4 replicas (parts of 2, 1, 1, 1) fails; the
    pipeline tops the last merged batch up to a multiple of 8 (test_pipelines)."""
    buckets = make_buckets(max_length=64, tokens_per_batch=512, num_replicas=replicas)
    assert buckets.batch_sizes[:3] == (64, 32, 16) and buckets.merge_unit == 8
    plan = buckets.epoch_plan([20] * 5 + [5] * 25)  # every row is a leftover: 5 of length 24, 25 of length 8
    # Two batches are the fewest (a batch led by a row of length 24 holds 16). (5)(25) would pad least,
    # 320 tokens a side; cut at a multiple of 8, (8)(22 and 2 all-padding rows) pads 384 where (16)(14 + 2)
    # pads 512: the same batches for 1, 2, 4 or 8 replicas.
    assert plan.merged_rows == (8, 22)
    assert all(rows % replicas == 0 for rows in plan.merged_rows[:-1])

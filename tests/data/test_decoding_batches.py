"""pipelines/decoding_batches.py: sentences batched by length for decoding, outputs back in input order."""

from pipelines import decoding_dataset, restore_order


def test_evaluation_batches_restore_the_original_order(tokenizer):
    sources = ["alpha beta gamma delta", "", "omega", " ".join(["zeta"] * 300), "haus baum", "kappa " * 5]
    batches = list(decoding_dataset(sources, tokenizer, tokens_per_batch=64, max_batch_size=2))
    lengths = [b["inputs"].shape[1] for b in batches]
    assert lengths == sorted(lengths)
    assert all(b["inputs"].shape[0] <= 2 for b in batches)
    assert any(b["inputs"].shape[1] > 300 for b in batches)  # never truncated
    # "decode" each batch by detokenizing its inputs; the outputs come back in input order.
    outputs = [tokenizer.detokenize(b["inputs"]).numpy() for b in batches]
    restored = restore_order([b["index"].numpy() for b in batches], outputs, len(sources))
    assert [r.decode() for r in restored] == [" ".join(s.split()) for s in sources]

"""The reference for the OPUS-MT import: a tiny random Marian model, as Hugging Face saves one, and its outputs.

``python -m tests.importing.marian_reference DIR`` (needs torch, transformers: ``pip install -e '.[reference]'``)
writes into ``DIR`` what an OPUS-MT directory holds (``config.json``, ``model.safetensors``, ``source.spm``,
``target.spm``, ``vocab.json``) and ``reference.npz``: Hugging Face's tokenization, logits and greedy output.
``tests/fixtures/marian`` is this script's output, committed so the default tests need neither package; the slow
test ``test_the_committed_reference_is_what_transformers_computes`` runs it again and compares.

The model is random but not uniform: every weight is drawn with a spread that makes the logits far apart, so
greedy search has one clear choice at each step. Its positions are Marian's (``[sin | cos]`` at
exp(−i·ln 10000/(d/2 − 1))): the logits ``logits`` are those of the model as Marian trained it, and
``logits_paper`` those of Hugging Face's own table (1/10000^(2i/d)).
"""

from __future__ import annotations

import io
import json
import math
import pathlib
import sys

import numpy as np
import sentencepiece as spm

from tests.corpora import WORDS

D_MODEL, LAYERS, HEADS, FFN = 8, 2, 2, 16
MAX_NEW_TOKENS = 12
SOURCES = ["alpha beta gamma", "haus baum katze hund delta", "omega", "sigma zeta theta kappa lambda epsilon"]
TARGETS = ["Alpha beta.", "Haus baum katze.", "Omega omega omega omega.", "Sigma."]
DROPPED_PIECE_SIDE = "source"  # one piece of source.spm is left out of vocab.json: it must tokenize as <unk>


def _texts(seed: int, capitalize: bool) -> list[str]:
    rng = np.random.default_rng(seed)
    lines = [" ".join(rng.choice(WORDS, rng.integers(1, 9))) for _ in range(300)]
    return [line.capitalize() + "." for line in lines] if capitalize else lines


def _spm(lines: list[str], size: int) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=size,
        model_type="unigram",
        normalization_rule_name="identity",  # no character map: a model of a few KB
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return model.getvalue()


def marian_positions(length: int, d: int) -> np.ndarray:
    """Marian's sinusoids (src/tensors/cpu/tensor_operators.cpp): ``[sin | cos]`` at exp(−i·ln 10000/(d/2 − 1))."""
    half = d // 2
    rates = np.exp(-np.arange(half) * math.log(10000.0) / (half - 1))
    angles = np.arange(length)[:, None] * rates[None, :]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1).astype(np.float32)


def write(directory: pathlib.Path) -> None:
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    directory.mkdir(parents=True, exist_ok=True)
    source_model, target_model = _spm(_texts(0, False), 40), _spm(_texts(1, True), 40)
    (directory / "source.spm").write_bytes(source_model)
    (directory / "target.spm").write_bytes(target_model)
    source_pieces = spm.SentencePieceProcessor(model_proto=source_model)
    target_pieces = spm.SentencePieceProcessor(model_proto=target_model)

    def normal(processor):
        return [processor.id_to_piece(i) for i in range(processor.get_piece_size()) if not processor.is_control(i)]

    dropped = next(p for p in normal(source_pieces) if p not in normal(target_pieces) and p != "<unk>")
    pieces = ["</s>", "<unk>"]
    for piece in normal(source_pieces) + normal(target_pieces):
        if piece not in pieces and piece != dropped:
            pieces.append(piece)
    pieces.append("<pad>")  # last, as in OPUS-MT's vocabularies
    vocab = {piece: i for i, piece in enumerate(pieces)}
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=1), encoding="utf-8")
    pad, eos = vocab["<pad>"], vocab["</s>"]

    config = MarianConfig(
        vocab_size=len(vocab),
        decoder_vocab_size=len(vocab),
        d_model=D_MODEL,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_ffn_dim=FFN,
        decoder_ffn_dim=FFN,
        activation_function="swish",
        max_position_embeddings=64,
        pad_token_id=pad,
        eos_token_id=vocab["</s>"],
        decoder_start_token_id=pad,
        forced_eos_token_id=vocab["</s>"],
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        dropout=0.1,
    )
    tokenizer = MarianTokenizer(
        str(directory / "source.spm"), str(directory / "target.spm"), str(directory / "vocab.json")
    )
    batch = tokenizer(SOURCES + [dropped.replace("▁", " ").strip()], padding=True, return_tensors="pt")

    def greedy(model):
        """Hugging Face's greedy output, and the smallest gap between the best and the second logit of a step."""
        with torch.no_grad():
            out = model.generate(
                **batch,
                num_beams=1,
                do_sample=False,
                max_new_tokens=MAX_NEW_TOKENS,
                min_length=0,
                bad_words_ids=[[pad]],
                output_logits=True,
                return_dict_in_generate=True,
            )
        gaps = [np.diff(np.sort(step.numpy(), axis=-1)[:, -2:], axis=-1).min() for step in out.logits[:-1]]
        return out.sequences.numpy(), min(gaps)

    for seed in range(100):  # the first draw whose greedy outputs hold 4 tokens or more, never start
        # with EOS and never come near a tie
        torch.manual_seed(seed)
        model = MarianMTModel(config).eval()
        with torch.no_grad():
            for name, weight in model.named_parameters():
                if "embed_positions" in name:
                    continue
                if name.endswith("layer_norm.weight"):
                    weight.copy_(1.0 + 0.2 * torch.randn_like(weight))
                else:
                    weight.copy_(0.5 * torch.randn_like(weight))
            model.model.shared.weight[pad].zero_()  # Marian's decoder starts from zeros: the pad row, in this port
            model.final_logits_bias.copy_(0.5 * torch.randn_like(model.final_logits_bias))
            for stack in (model.model.encoder, model.model.decoder):
                table = stack.embed_positions.weight
                table.copy_(torch.from_numpy(marian_positions(table.shape[0], table.shape[1])))
        sequences, gap = greedy(model)
        if len(set(sequences[:, 1:].ravel().tolist())) >= 4 and gap > 0.05 and (sequences[:, 1] != eos).all():
            break
    else:
        raise RuntimeError("no seed of 100 gave a greedy output of 4 tokens or more without near-ties")
    model.save_pretrained(directory, safe_serialization=True)
    (directory / "generation_config.json").unlink(missing_ok=True)
    targets = tokenizer(text_target=TARGETS + ["Beta."], padding=True, return_tensors="pt")["input_ids"]
    decoder_inputs = torch.cat([torch.full((targets.shape[0], 1), pad), targets[:, :-1]], dim=1)
    decoder_inputs = decoder_inputs.masked_fill(decoder_inputs == pad, pad)

    def logits():
        with torch.no_grad():
            return model(**batch, decoder_input_ids=decoder_inputs).logits.numpy()

    logits_marian = logits()
    for stack in (model.model.encoder, model.model.decoder):  # Hugging Face's own table
        stack.embed_positions.weight.data = stack.embed_positions.create_weight()
    logits_paper = logits()
    np.savez(
        directory / "reference.npz",
        sources=np.array(SOURCES + [dropped.replace("▁", " ").strip()]),
        targets=np.array(TARGETS + ["Beta."]),
        input_ids=batch["input_ids"].numpy(),
        attention_mask=batch["attention_mask"].numpy(),
        target_ids=targets.numpy(),
        decoder_input_ids=decoder_inputs.numpy(),
        logits=logits_marian,
        logits_paper=logits_paper,
        greedy=sequences,
        seed=seed,
        dropped_piece=np.array(dropped),
    )


if __name__ == "__main__":
    write(pathlib.Path(sys.argv[1]))

"""Hugging Face transformers: ``MarianMTModel`` (PyTorch, CPU), randomly initialised from a
``MarianConfig`` with the preset's dimensions; trained by PyTorch Adam steps (float32, and
bfloat16 autocast as ``--hf_bfloat16_train`` says), decoding by ``generate``.

Marian (and CTranslate2's Marian converter, :mod:`.ct2`) keeps ``<pad>`` as the last
vocabulary id, while ours is 0: ids 0 and V-1 trade places on the way in
(:func:`marian_ids`), which changes no amount of work.
"""

from __future__ import annotations

import copy
import time

import numpy as np

import pipelines
from benchmarks.common import has_bfloat16_hardware
from benchmarks.peers import DecodeRun, DecodingWorkload, Training
from benchmarks.peers.workload import EOS, FLAGS, PAD, one_after_another, training_batch
from configs import get_config


def train_runners(size: str) -> dict[str, Training]:
    """float32; bfloat16 autocast too where ``--hf_bfloat16_train`` asks for it (by default: bfloat16 hardware)."""
    autocast = {"hf_float32": False}
    if FLAGS.hf_bfloat16_train == "always" or (FLAGS.hf_bfloat16_train == "auto" and has_bfloat16_hardware()):
        autocast["hf_bfloat16"] = True
    return {name: trainer(size, bf16) for name, bf16 in autocast.items()}


def decode_runners(size: str, workload: DecodingWorkload) -> dict[str, DecodeRun]:
    """``generate`` with float32 and with bfloat16 weights."""
    import torch

    model = marian(size)
    return {
        "hf_float32": decoder(model, workload.batches),
        "hf_bfloat16": decoder(copy.deepcopy(model).to(torch.bfloat16), workload.batches),
    }


def marian_ids(ids: np.ndarray) -> np.ndarray:
    """Our ids in Marian's vocabulary order (ids 0 = ``<pad>`` and V-1 swapped)."""
    last = FLAGS.vocab_size - 1
    return np.where(ids == PAD, last, np.where(ids == last, PAD, ids))


def marian(size: str):
    """A randomly initialised ``MarianMTModel`` with the ``size`` preset's dimensions; PyTorch on ``--threads``."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    torch.set_num_threads(FLAGS.threads)
    config = get_config(size, vocab_size=FLAGS.vocab_size)
    torch.manual_seed(0)
    marian_config = MarianConfig(
        vocab_size=FLAGS.vocab_size,
        d_model=config.d_model,
        encoder_layers=config.num_layers,
        decoder_layers=config.num_layers,
        encoder_attention_heads=config.num_heads,
        decoder_attention_heads=config.num_heads,
        encoder_ffn_dim=config.d_ff,
        decoder_ffn_dim=config.d_ff,
        max_position_embeddings=config.max_positions,
        activation_function="relu",
        dropout=config.dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=FLAGS.vocab_size - 1,
        eos_token_id=EOS,
        bos_token_id=pipelines.BOS_ID,
        decoder_start_token_id=FLAGS.vocab_size - 1,
        forced_eos_token_id=None,
    )
    return MarianMTModel(marian_config)


def trainer(size: str, bf16: bool) -> Training:
    """The Marian model trained by PyTorch Adam steps (bfloat16 autocast if ``bf16``)."""
    import torch

    model = marian(size)
    model.train()
    src, tgt = (torch.from_numpy(x.astype("int64")) for x in training_batch())
    decoder_inputs = torch.cat([torch.full_like(tgt[:, :1], FLAGS.vocab_size - 1), tgt[:, :-1]], dim=1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def run(steps: int) -> list[float]:
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(
                    input_ids=src, attention_mask=torch.ones_like(src), decoder_input_ids=decoder_inputs, labels=tgt
                ).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - start)
        return times

    run(2)
    return Training(run, {"params": model.num_parameters()})


def decoder(model, batches: list[np.ndarray]) -> DecodeRun:
    """``run(group)``: ``generate`` on ``batches[i]`` for each ``i`` of ``group`` (beam search, forced length)."""
    import torch

    model.eval()
    inputs = [torch.from_numpy(marian_ids(batch).astype("int64")) for batch in batches]

    def run(i):
        with torch.inference_mode():
            out = model.generate(
                input_ids=inputs[i],
                attention_mask=(inputs[i] != FLAGS.vocab_size - 1).long(),
                num_beams=FLAGS.beam,
                do_sample=False,
                min_new_tokens=FLAGS.output_tokens,
                max_new_tokens=FLAGS.output_tokens,
            )
        assert out.shape[1] == FLAGS.output_tokens + 1, out.shape  # the start token + the forced length

    return one_after_another(run)  # on --threads threads

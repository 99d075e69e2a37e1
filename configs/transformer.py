"""One frozen configuration dataclass and the named presets: what the model is and the numbers of its
training recipe.

A :class:`TransformerConfig` holds the model, the training recipe's numbers (label smoothing, warmup,
the run's length ``train_steps``, its batches' ``tokens_per_batch`` and ``max_train_length``, and the
``vocab_size`` asked of a new vocabulary) and the decoding defaults. How and where a run trains (its data,
strategy, precision, checkpoints, ``epochs`` instead of ``train_steps``) is a
:class:`configs.training.RunOptions`. ``tft-train``'s ``--train_steps``, ``--tokens_per_batch``,
``--max_train_length`` and ``--vocab_size`` set these config fields, as ``--set`` does.

The presets follow the paper (Vaswani et al., 2017): ``base`` and ``big`` are the
bottom and top rows of Table 3, and ``A1`` … ``E`` are the Table 3 variations,
top to bottom as printed ("unlisted values are identical to those of the base
model"). ``tiny`` is for tests and ``small`` trains on a 2-core CPU in minutes; ``multi30k``
is ``small`` decoded as chosen on Multi30k's validation set, ``multi30k_40min`` its 40-minute
recipe. ``parsing`` is section 6.3's model and ``parsing_cpu`` its CPU counterpart.

Every departure from the paper is a named field whose default is the paper's
choice (``pre_norm=False``, ``position="sinusoidal"``, ``shared_embeddings=True``).
Variants are derived with ``dataclasses.replace`` (see :func:`get_config`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from configs.decoding import PARSING_DECODING, SETTINGS

# The FFN activations (Keras names): the paper's ReLU, and the swish and GELU of other implementations.
ACTIVATIONS = ("relu", "swish", "gelu")
# The training-recipe fields that say how long a run trains and on which batches. ``config.json``'s model
# records them as the run used them; a resumed run compares them as run options, by their flags' names
# (tf_transformer.training.options.effective), and may change ``train_steps`` only.
RUN_SETTINGS = ("train_steps", "tokens_per_batch", "max_train_length")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of the model and its training defaults.

    Model (paper section 3, Table 3 column names):
      num_layers: N, the number of encoder layers and of decoder layers.
      encoder_layers, decoder_layers: each stack's own depth where they differ
        (``None`` → ``num_layers``; the paper's stacks are equal, section 3.1).
        Decoding runs the decoder once per output token and the encoder once per
        sentence, so a deep encoder with a shallow decoder decodes faster.
      d_model: width of every sub-layer output and of the embeddings.
      d_ff: inner width of the position-wise feed-forward network (eq. 2).
      num_heads: h, the number of attention heads.
      key_dim: d_k, per-head query/key width (``None`` → d_model / num_heads).
      value_dim: d_v, per-head value width (``None`` → d_model / num_heads).
      dropout: P_drop, residual dropout and dropout on embeddings+positions (5.4).
      attention_dropout: dropout on attention weights (not in the paper: 0).
      relu_dropout: dropout after the FFN's ReLU (not in the paper: 0).
      position: ``"sinusoidal"`` (section 3.5) or ``"learned"`` (Table 3 row E).
      max_positions: longest position a learned embedding can represent.
      pre_norm: ``False`` is the paper's post-LN ``LayerNorm(x + Sublayer(x))``;
        ``True`` is the common pre-LN variant ``x + Sublayer(LayerNorm(x))``.
      layer_norm_epsilon: epsilon of every LayerNormalization.
      attention_bias: biases in the attention projections. The paper's W^Q,
        W^K, W^V, W^O have none (section 3.2.2); the FFN keeps its b1, b2.
      vocab_size: the shared source/target vocabulary size (section 5.1): the size asked of a new
        vocabulary, then the size of the vocabulary made (SentencePiece may give fewer pieces).
      shared_embeddings: one matrix for source and target embeddings and the
        pre-softmax projection (section 3.4). ``False`` gives the source its own
        embedding (of ``source_vocab_size``) while the target embedding stays
        tied to the output projection.
      source_vocab_size: source vocabulary size when ``shared_embeddings=False``
        (``None`` → ``vocab_size``; :attr:`encoder_vocab_size` is the size in use).

    Other implementations' choices, so their checkpoints run as trained (docs/importing.md);
    the defaults are the paper's:
      activation: the FFN's inner activation: ``"relu"`` (eq. 2), ``"swish"``
        (Marian's OPUS-MT models) or ``"gelu"``.
      logits_bias: a learned bias on the pre-softmax logits (Marian has one).
      position_layout: sinusoids ``"interleaved"`` (section 3.5's formula) or
        ``"halves"`` (``[sin | cos]``, tensor2tensor's and Marian's).
      position_timescales: ``"paper"`` (1/10000^(2i/d_model)) or ``"tensor2tensor"``
        (exp(−i·ln 10000/(d_model/2 − 1)), Marian's).
      zero_bos_embedding: BOS, the decoder's first input, embeds to zeros (Marian
        starts its decoder from a zero vector).

    Training (section 5):
      label_smoothing: ε_ls.
      train_steps: optimizer steps of a full run (unless ``RunOptions.epochs`` says how long instead).
      warmup_steps: warmup of the learning-rate schedule (eq. 3).
      learning_rate_scale: multiplies eq. 3 (1.0 in the paper).
      tokens_per_batch: source (and target) tokens per global batch (5.1).
      max_train_length: training length filter, in subwords, per side (EOS included).

    Inference (section 6.1):
      beam_size, alpha (the length penalty α), max_extra_length (longest output =
      input length + this).
    """

    name: str = "base"
    # Model.
    num_layers: int = 6
    encoder_layers: int | None = None
    decoder_layers: int | None = None
    d_model: int = 512
    d_ff: int = 2048
    num_heads: int = 8
    key_dim: int | None = None
    value_dim: int | None = None
    dropout: float = 0.1
    attention_dropout: float = 0.0
    relu_dropout: float = 0.0
    position: str = "sinusoidal"
    max_positions: int = 1024
    pre_norm: bool = False
    layer_norm_epsilon: float = 1e-6
    attention_bias: bool = False
    vocab_size: int = 37000
    shared_embeddings: bool = True
    source_vocab_size: int | None = None
    activation: str = "relu"
    logits_bias: bool = False
    position_layout: str = "interleaved"
    position_timescales: str = "paper"
    zero_bos_embedding: bool = False
    # Training.
    label_smoothing: float = 0.1
    train_steps: int = 100_000
    warmup_steps: int = 4000
    learning_rate_scale: float = 1.0
    tokens_per_batch: int = 25_000
    max_train_length: int = 256
    # Inference (their defaults and ranges: configs/decoding.py).
    beam_size: int = SETTINGS["beam_size"].default
    alpha: float = SETTINGS["alpha"].default
    max_extra_length: int = SETTINGS["max_extra_length"].default

    def __post_init__(self):
        def fail(field, why):
            raise ValueError(f"TransformerConfig({self.name!r}).{field}: {why}")

        for field in ("num_layers", "d_model", "d_ff", "num_heads", "vocab_size", "max_positions", *RUN_SETTINGS):
            if getattr(self, field) <= 0:
                fail(field, f"must be positive, got {getattr(self, field)}")
        for field in ("encoder_layers", "decoder_layers"):
            if getattr(self, field) is not None and getattr(self, field) <= 0:
                fail(field, f"must be positive, got {getattr(self, field)}")
        if self.key_dim is None and self.d_model % self.num_heads:
            fail("key_dim", f"d_model {self.d_model} is not divisible by num_heads {self.num_heads}; set key_dim")
        if self.value_dim is None and self.d_model % self.num_heads:
            fail("value_dim", f"d_model {self.d_model} is not divisible by num_heads {self.num_heads}; set value_dim")
        for field in ("dropout", "attention_dropout", "relu_dropout", "label_smoothing"):
            if not 0.0 <= getattr(self, field) < 1.0:
                fail(field, f"must be in [0, 1), got {getattr(self, field)}")
        choices = dict(
            position=("sinusoidal", "learned"),
            activation=ACTIVATIONS,
            position_layout=("interleaved", "halves"),
            position_timescales=("paper", "tensor2tensor"),
        )
        for field, allowed in choices.items():
            if getattr(self, field) not in allowed:
                fail(field, f"must be one of {', '.join(allowed)}; got {getattr(self, field)!r}")

    @property
    def encoder_depth(self) -> int:
        """Encoder layers actually built: ``encoder_layers`` or N (section 3.1)."""
        return self.encoder_layers if self.encoder_layers is not None else self.num_layers

    @property
    def decoder_depth(self) -> int:
        """Decoder layers actually built: ``decoder_layers`` or N (section 3.1)."""
        return self.decoder_layers if self.decoder_layers is not None else self.num_layers

    @property
    def head_key_dim(self) -> int:
        """d_k actually used: ``key_dim`` or d_model / num_heads (section 3.2.2)."""
        return self.key_dim if self.key_dim is not None else self.d_model // self.num_heads

    @property
    def head_value_dim(self) -> int:
        """d_v actually used: ``value_dim`` or d_model / num_heads (section 3.2.2)."""
        return self.value_dim if self.value_dim is not None else self.d_model // self.num_heads

    @property
    def encoder_vocab_size(self) -> int:
        """Rows of the source embedding: ``vocab_size`` when shared (section 3.4), else ``source_vocab_size``."""
        if self.shared_embeddings or self.source_vocab_size is None:
            return self.vocab_size
        return self.source_vocab_size

    def replace(self, **changes: Any) -> TransformerConfig:
        """A copy with ``changes`` applied; unknown field names raise ValueError."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(f"Unknown TransformerConfig field(s): {', '.join(unknown)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TransformerConfig:
        """The config of ``values`` (a ``config.json``'s ``model``); unknown field names raise ValueError."""
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"Unknown TransformerConfig field(s): {', '.join(unknown)}")
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> TransformerConfig:
        return cls.from_dict(json.loads(text))


_BASE = TransformerConfig(name="base")

# Table 3, top to bottom as printed. Unlisted values are those of the base model.
_TABLE3 = {
    # (A) vary heads and d_k, d_v keeping computation constant (section 3.2.2).
    "A1": dict(num_heads=1, key_dim=512, value_dim=512),
    "A2": dict(num_heads=4, key_dim=128, value_dim=128),
    "A3": dict(num_heads=16, key_dim=32, value_dim=32),
    "A4": dict(num_heads=32, key_dim=16, value_dim=16),
    # (B) smaller attention key size d_k (d_v stays 64).
    "B1": dict(key_dim=16),
    "B2": dict(key_dim=32),
    # (C) bigger and smaller models.
    "C1": dict(num_layers=2),
    "C2": dict(num_layers=4),
    "C3": dict(num_layers=8),
    "C4": dict(d_model=256, key_dim=32, value_dim=32),
    "C5": dict(d_model=1024, key_dim=128, value_dim=128),
    "C6": dict(d_ff=1024),
    "C7": dict(d_ff=4096),
    # (D) dropout and label smoothing.
    "D1": dict(dropout=0.0),
    "D2": dict(dropout=0.2),
    "D3": dict(label_smoothing=0.0),
    "D4": dict(label_smoothing=0.2),
    # (E) learned positional embedding instead of sinusoids.
    "E": dict(position="learned"),
}


# Trains on a 2-core CPU in minutes (Multi30k scale: ~8k shared subwords).
# Peak learning rate 0.8 · 256^-0.5 · 500^-0.5 ≈ 2.2e-3 at step 500: with
# 2.0 and warmup 800 (4.4e-3) post-LN training went unstable on Multi30k.
_SMALL = _BASE.replace(
    name="small",
    num_layers=3,
    d_model=256,
    d_ff=1024,
    num_heads=4,
    vocab_size=8000,
    train_steps=8000,
    warmup_steps=500,
    learning_rate_scale=0.8,
    tokens_per_batch=4096,
    max_train_length=128,
)


PRESETS: dict[str, TransformerConfig] = {
    # For tests: builds and runs a step in well under a second.
    "tiny": _BASE.replace(
        name="tiny",
        num_layers=2,
        d_model=32,
        d_ff=64,
        num_heads=4,
        vocab_size=256,
        max_positions=256,
        train_steps=200,
        warmup_steps=50,
        tokens_per_batch=2048,
        max_train_length=64,
    ),
    "small": _SMALL,
    # `make demo`'s and benchmarks.quality's recipe for Multi30k on a 2-core CPU: `small` trained as it is,
    # decoded with the length penalty chosen on Multi30k's validation set (α 0.6 left outputs 8 % short).
    # docs/training.md#the-multi30k-recipe says what else was tried.
    "multi30k": _SMALL.replace(name="multi30k", alpha=2.0),
    # benchmarks.quality's 40 minutes: with P_drop 0.1 `small` overfits after about 20 (val loss rises); 0.2
    # scores best of 0.1 / 0.2 / 0.3 on val at 40 minutes, and attention and ReLU dropout 0.1 on top of it
    # better on both seeds of each (docs/training.md#the-multi30k-recipe).
    "multi30k_40min": _SMALL.replace(
        name="multi30k_40min", alpha=2.0, dropout=0.2, attention_dropout=0.1, relu_dropout=0.1
    ),
    "base": _BASE,
    "big": _BASE.replace(name="big", d_model=1024, d_ff=4096, num_heads=16, dropout=0.3, train_steps=300_000),
    **{name: _BASE.replace(name=name, **changes) for name, changes in _TABLE3.items()},
    # Section 6.3: English constituency parsing, "a 4-layer transformer with d_model = 1024", beam 21,
    # α = 0.3, outputs up to input length + 300. Targets are whole symbols (docs/parsing.md), about
    # 62 a sentence and up to ~570. Dropout: docs/design/parsing.md says how it was chosen.
    "parsing": _BASE.replace(
        name="parsing",
        num_layers=4,
        d_model=1024,
        d_ff=4096,
        num_heads=16,
        dropout=0.3,
        vocab_size=16000,
        max_train_length=640,
        **PARSING_DECODING,
    ),
    # The parsing task within 40 minutes on a 2-core CPU (benchmarks/parsing.py): the WSJ sample's
    # ~3,400 trees. A small model sees the most tokens in the budget; pre-norm takes a high learning
    # rate (128^-0.5 · 300^-0.5 ≈ 5.1e-3 at step 300). docs/design/parsing.md says how each was chosen.
    "parsing_cpu": _BASE.replace(
        name="parsing_cpu",
        num_layers=3,
        d_model=128,
        d_ff=512,
        num_heads=4,
        dropout=0.1,
        pre_norm=True,
        vocab_size=4000,
        train_steps=20000,
        warmup_steps=300,
        learning_rate_scale=1.0,
        tokens_per_batch=1024,
        max_train_length=640,
        **PARSING_DECODING,
    ),
    # Students of a `multi30k` teacher, trained on its translations (docs/distillation.md): decoding's cost is
    # in the decoder, run once per output token, so they keep or deepen the encoder and keep one decoder layer
    # (Kasai et al., 2021, "Deep Encoder, Shallow Decoder"). The teacher's width and vocabulary: its
    # SentencePiece model is reused. Six post-LN encoder layers at `small`'s peak rate learn at half the pace
    # (docs/distillation.md#students), so the deep student is pre-LN.
    "student_6_1": _SMALL.replace(name="student_6_1", alpha=2.0, encoder_layers=6, decoder_layers=1, pre_norm=True),
    "student_3_1": _SMALL.replace(name="student_3_1", alpha=2.0, encoder_layers=3, decoder_layers=1),
    "student_3_1_narrow": _SMALL.replace(
        name="student_3_1_narrow", alpha=2.0, encoder_layers=3, decoder_layers=1, d_model=128, d_ff=512
    ),
}


def parse_overrides(settings: list[str]) -> dict[str, Any]:
    """``["dropout=0.2", "position=learned"]`` → ``{"dropout": 0.2, "position": "learned"}``.

    Values are JSON (numbers, booleans) or else plain strings; unknown fields raise ``ValueError``.
    """
    fields = [f.name for f in dataclasses.fields(TransformerConfig)]
    overrides: dict[str, Any] = {}
    for setting in settings:
        name, sep, value = setting.partition("=")
        if not sep or name not in fields:
            raise ValueError(f"--set {setting!r}: expected FIELD=VALUE with FIELD one of {', '.join(fields)}")
        try:
            overrides[name] = json.loads(value)
        except json.JSONDecodeError:
            overrides[name] = value
    return overrides


def preset_names() -> list[str]:
    """The names ``--config`` accepts: tiny, small, base, big, Table 3's rows, then the parsing presets."""
    return list(PRESETS)


def get_config(name: str, **overrides: Any) -> TransformerConfig:
    """The preset ``name`` with ``overrides`` applied via ``dataclasses.replace``."""
    if name not in PRESETS:
        raise ValueError(f"Unknown config {name!r}; choose one of: {', '.join(PRESETS)}")
    config = PRESETS[name]
    return config.replace(**overrides) if overrides else config

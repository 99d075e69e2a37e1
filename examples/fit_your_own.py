"""Train our Transformer with plain Keras `compile` + `fit` in your own script.

python examples/fit_your_own.py --data ../shared/data/multi30k --steps 20
"""

import argparse

import pipelines
from configs import get_config
from tf_transformer import build_transformer
from tf_transformer.training import LabelSmoothedCrossEntropy, TokenAccuracy, paper_optimizer

parser = argparse.ArgumentParser()
parser.add_argument("--data", default="../shared/data/multi30k")
parser.add_argument("--vocab", default="/tmp/fit_your_own_sp.model")
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()

corpus = pipelines.find_split(args.data, "train", "en", "de")
pipelines.train_sentencepiece(corpus.pairs(), args.vocab, vocab_size=2000)
tokenizer = pipelines.Tokenizer(args.vocab)
train = pipelines.training_dataset(corpus, tokenizer, tokens_per_batch=2048, max_train_length=64, repeat=True)

config = get_config("tiny", vocab_size=tokenizer.vocab_size)
model = build_transformer(config)
model.compile(
    optimizer=paper_optimizer(config.d_model, warmup_steps=config.warmup_steps),  # Adam 0.9/0.98/1e-9 + eq. 3
    loss=LabelSmoothedCrossEntropy(config.label_smoothing),  # ε_ls = 0.1, padding ignored
    metrics=[TokenAccuracy()],
)
history = model.fit(train.dataset, steps_per_epoch=args.steps, epochs=1)
print("final loss", history.history["loss"][-1])

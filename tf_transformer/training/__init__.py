"""Training: the paper's loss, metrics, schedule and optimizer, strategies and the run drivers."""

from tf_transformer.training.losses import LabelSmoothedCrossEntropy
from tf_transformer.training.metrics import TokenAccuracy, TokenPerplexity
from tf_transformer.training.optimizers import FusedAdam
from tf_transformer.training.schedules import TransformerSchedule, paper_optimizer

__all__ = [
    "FusedAdam",
    "LabelSmoothedCrossEntropy",
    "TokenAccuracy",
    "TokenPerplexity",
    "TransformerSchedule",
    "paper_optimizer",
]

"""Model and training presets (``tiny``, ``small``, ``base``, ``big``, Table 3's rows) and run options."""

from configs.training import CLOSINGS, PRECISIONS, SCHEDULES, STRATEGIES, TREE_LOSSES, RunOptions
from configs.transformer import PRESETS, RUN_SETTINGS, TransformerConfig, get_config, parse_overrides, preset_names

__all__ = [
    "CLOSINGS",
    "PRECISIONS",
    "PRESETS",
    "RUN_SETTINGS",
    "SCHEDULES",
    "STRATEGIES",
    "RunOptions",
    "TREE_LOSSES",
    "TransformerConfig",
    "get_config",
    "parse_overrides",
    "preset_names",
]

"""Model and training presets: ``tiny``, ``small``, ``base``, ``big`` and Table 3's rows."""

from configs.transformer import PRESETS, TransformerConfig, get_config, parse_overrides, preset_names

__all__ = ["PRESETS", "TransformerConfig", "get_config", "parse_overrides", "preset_names"]

"""Models trained elsewhere as run directories of ours (docs/importing.md)."""

"""The CPU this process runs on, as ``/proc/cpuinfo`` describes it (read once)."""

from __future__ import annotations

import functools
import platform


@functools.cache
def cpu_info() -> tuple[str, frozenset[str]]:
    """The CPU's model name and feature flags; where there is no ``/proc/cpuinfo``, ``platform``'s name and no flags."""
    model, flags = platform.processor(), frozenset()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = frozenset(value.split())
                    break
    except OSError:
        pass
    return model, flags

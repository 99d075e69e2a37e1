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


# CPU flags of a bfloat16 matrix unit (/proc/cpuinfo): AVX512_BF16 (AMD Zen 4 and later, Intel Cooper
# Lake) and AMX (Intel Sapphire Rapids and later). Without them bfloat16 products are emulated.
BFLOAT16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def bfloat16_units() -> list[str]:
    """The flags of :data:`BFLOAT16_CPU_FLAGS` this CPU has (empty: bfloat16 would be emulated, slower than float32)."""
    return [flag for flag in BFLOAT16_CPU_FLAGS if flag in cpu_info()[1]]


def choose_cpu_precision(bfloat16: str) -> tuple[str, str]:
    """``(precision, reason)`` of ``auto`` on this CPU: ``bfloat16`` (the name given) where it has a bfloat16 unit.

    Training passes ``"mixed_bfloat16"`` (float32 variables), an export ``"bfloat16"``
    (weights stored in it). Emulated bfloat16 is slower than float32 (docs/benchmarks.md).
    """
    model = cpu_info()[0]
    found = bfloat16_units()
    if found:
        return bfloat16, f"the CPU ({model}) computes in bfloat16 ({', '.join(found)})"
    return "float32", f"the CPU ({model}) has no bfloat16 unit ({' or '.join(BFLOAT16_CPU_FLAGS)}): float32 is faster"

"""The CPU this process runs on, as ``/proc/cpuinfo`` describes it (read once), within oneDNN's ISA cap.

``ONEDNN_MAX_CPU_ISA`` (oneDNN's own variable, read by TensorFlow's oneDNN
kernels) caps the instructions oneDNN uses: ``AVX2`` on an AVX-512 CPU runs
its AVX2 kernels, as an AVX2-only CPU would. What the process decides from the
CPU's flags (``--precision auto``, the decoding kernels' layout) reads them
within that cap (:func:`usable_flags`): under ``AVX2`` a bfloat16 product has no
oneDNN kernel and aborts the process, under ``AVX512_CORE`` it is emulated.
"""

from __future__ import annotations

import functools
import os
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


# oneDNN's ISA levels (ONEDNN_MAX_CPU_ISA's values), lowest first, with their older names.
ONEDNN_ISAS = (
    "SSE41",
    "AVX",
    "AVX2",
    "AVX2_VNNI",
    "AVX2_VNNI_2",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
    "AVX512_CORE_BF16",
    "AVX10_1_512",
    "AVX10_1_512_AMX",
    "AVX10_1_512_AMX_FP16",
)
_ONEDNN_ALIASES = {
    "AVX512_CORE_FP16": "AVX10_1_512",
    "AVX512_CORE_AMX": "AVX10_1_512_AMX",
    "AVX512_CORE_AMX_FP16": "AVX10_1_512_AMX_FP16",
}
# The lowest oneDNN ISA whose kernels use a CPU flag; flags not listed are usable under any cap.
_FLAG_ISA = {
    "avx512f": "AVX512_CORE",
    "avx512_bf16": "AVX512_CORE_BF16",
    "amx_bf16": "AVX10_1_512_AMX",
    "amx_tile": "AVX10_1_512_AMX",
}


def onednn_isa_cap() -> str | None:
    """``ONEDNN_MAX_CPU_ISA`` (or its older name ``DNNL_MAX_CPU_ISA``) as one of :data:`ONEDNN_ISAS`;
    ``None`` when unset, ``ALL`` or ``DEFAULT``. An unknown value raises ValueError naming it."""
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        value = os.environ.get(name, "").strip().upper()
        if not value:
            continue
        if value in ("ALL", "DEFAULT"):
            return None
        value = _ONEDNN_ALIASES.get(value, value)
        if value not in ONEDNN_ISAS:
            raise ValueError(f"{name}={os.environ[name]}: not an ISA oneDNN knows; one of {', '.join(ONEDNN_ISAS)}")
        return value
    return None


def usable_flags() -> frozenset[str]:
    """The CPU's flags whose oneDNN kernels :func:`onednn_isa_cap` allows (all of them without a cap)."""
    flags = cpu_info()[1]
    cap = onednn_isa_cap()
    if cap is None:
        return flags
    level = ONEDNN_ISAS.index(cap)
    return frozenset(flag for flag in flags if ONEDNN_ISAS.index(_FLAG_ISA.get(flag, "SSE41")) <= level)


# CPU flags of a bfloat16 matrix unit (/proc/cpuinfo): AVX512_BF16 (AMD Zen 4 and later, Intel Cooper
# Lake) and AMX (Intel Sapphire Rapids and later). Without them bfloat16 products are emulated.
BFLOAT16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def bfloat16_units() -> list[str]:
    """The flags of :data:`BFLOAT16_CPU_FLAGS` this CPU has and oneDNN may use (:func:`usable_flags`; empty:
    bfloat16 would be emulated, slower than float32, or have no kernel at all)."""
    return [flag for flag in BFLOAT16_CPU_FLAGS if flag in usable_flags()]


def choose_cpu_precision(bfloat16: str) -> tuple[str, str]:
    """``(precision, reason)`` of ``auto`` on this CPU: ``bfloat16`` (the name given) where it has a bfloat16 unit.

    Training passes ``"mixed_bfloat16"`` (float32 variables), an export ``"bfloat16"``
    (weights stored in it). Emulated bfloat16 is slower than float32 (docs/benchmarks.md).
    """
    model = cpu_info()[0]
    found = bfloat16_units()
    if found:
        return bfloat16, f"the CPU ({model}) computes in bfloat16 ({', '.join(found)})"
    capped = [flag for flag in BFLOAT16_CPU_FLAGS if flag in cpu_info()[1]]
    if capped:
        return "float32", (
            f"ONEDNN_MAX_CPU_ISA={onednn_isa_cap()} keeps oneDNN from the CPU's bfloat16 unit ({', '.join(capped)}): "
            "float32"
        )
    return "float32", f"the CPU ({model}) has no bfloat16 unit ({' or '.join(BFLOAT16_CPU_FLAGS)}): float32 is faster"

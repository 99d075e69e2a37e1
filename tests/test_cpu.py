"""What the process decides from the CPU's flags, within oneDNN's ISA cap (``ONEDNN_MAX_CPU_ISA``)."""

import pytest

from tf_transformer import cpu
from tf_transformer.decoding.kernels import feed_forward_transposed

ZEN4 = ("AMD EPYC 9004", frozenset({"avx2", "avx512f", "avx512_bf16"}))
SAPPHIRE_RAPIDS = ("Intel Xeon", frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}))


@pytest.fixture
def machine(monkeypatch):
    def on(info, cap=None):
        monkeypatch.setattr(cpu, "cpu_info", lambda: info)
        monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
        if cap is None:
            monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
        else:
            monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)

    return on


@pytest.mark.parametrize(
    "info,cap,units",
    [
        (ZEN4, None, ["avx512_bf16"]),
        (ZEN4, "ALL", ["avx512_bf16"]),
        (ZEN4, "AVX512_CORE_BF16", ["avx512_bf16"]),
        (ZEN4, "avx512_core", []),  # oneDNN reads the value in any case
        (ZEN4, "AVX2", []),
        (SAPPHIRE_RAPIDS, None, ["avx512_bf16", "amx_bf16"]),
        (SAPPHIRE_RAPIDS, "AVX512_CORE_AMX", ["avx512_bf16", "amx_bf16"]),  # the older name of AVX10_1_512_AMX
        (SAPPHIRE_RAPIDS, "AVX512_CORE_BF16", ["avx512_bf16"]),
        (SAPPHIRE_RAPIDS, "AVX2", []),
    ],
)
def test_bfloat16_units_within_the_onednn_cap(machine, info, cap, units):
    machine(info, cap)
    assert cpu.bfloat16_units() == units


@pytest.mark.parametrize("cap", ["AVX2", "AVX512_CORE"])
def test_auto_precision_never_bfloat16_where_onednn_cannot_use_the_unit(machine, cap):
    """Under AVX2 a bfloat16 product has no oneDNN kernel (the process aborts); under AVX512_CORE it is emulated."""
    machine(ZEN4, cap)
    precision, reason = cpu.choose_cpu_precision("mixed_bfloat16")
    assert precision == "float32"
    assert f"ONEDNN_MAX_CPU_ISA={cap.upper()}" in reason and "avx512_bf16" in reason
    machine(ZEN4)
    assert cpu.choose_cpu_precision("bfloat16")[0] == "bfloat16"


def test_decoding_kernel_layout_follows_the_cap(machine):
    """An AVX-512 CPU capped at AVX2 lays the float32 feed-forward kernels out as an AVX2 CPU does."""
    machine(ZEN4)
    assert not feed_forward_transposed("float32")
    machine(ZEN4, "AVX2")
    assert feed_forward_transposed("float32")


def test_an_unknown_cap_is_refused_by_name(machine):
    machine(ZEN4, "AVX9000")
    with pytest.raises(ValueError, match="ONEDNN_MAX_CPU_ISA=AVX9000"):
        cpu.bfloat16_units()

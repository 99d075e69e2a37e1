"""Presets: the exact names, Table 3's values, and the dataclass contract."""

import dataclasses

import pytest

from configs import PRESETS, TransformerConfig, get_config, parse_overrides, preset_names

TABLE3_ORDER = ["A1", "A2", "A3", "A4", "B1", "B2"] + [f"C{i}" for i in range(1, 8)] + ["D1", "D2", "D3", "D4", "E"]


def test_preset_names_are_exactly_the_documented_ones_in_order():
    students = ["student_6_1", "student_3_1", "student_3_1_narrow"]
    assert preset_names() == ["tiny", "small", "multi30k", "multi30k_40min", "base", "big"] + TABLE3_ORDER + [
        "parsing",
        "parsing_cpu",
        *students,
    ]


def test_students_are_the_multi30k_teacher_with_a_deep_encoder_and_a_shallow_decoder():
    """Same vocabulary (the teacher's is reused) and decoding; only the depths, and one's width, differ."""
    teacher = get_config("multi30k")
    deep = teacher.replace(name="student_6_1", encoder_layers=6, decoder_layers=1, pre_norm=True)
    assert get_config("student_6_1") == deep
    assert get_config("student_3_1") == teacher.replace(name="student_3_1", encoder_layers=3, decoder_layers=1)
    narrow = teacher.replace(name="student_3_1_narrow", encoder_layers=3, decoder_layers=1, d_model=128, d_ff=512)
    assert get_config("student_3_1_narrow") == narrow


def test_table3_rows_change_only_their_listed_values():
    base = get_config("base")
    expected = {
        "A1": dict(num_heads=1, key_dim=512, value_dim=512),
        "A4": dict(num_heads=32, key_dim=16, value_dim=16),
        "B1": dict(key_dim=16),
        "C4": dict(d_model=256, key_dim=32, value_dim=32),
        "C7": dict(d_ff=4096),
        "D2": dict(dropout=0.2),
        "D4": dict(label_smoothing=0.2),
        "E": dict(position="learned"),
    }
    for name, changes in expected.items():
        assert get_config(name) == base.replace(name=name, **changes)
    big = get_config("big")
    assert (big.d_model, big.d_ff, big.num_heads, big.dropout, big.train_steps) == (1024, 4096, 16, 0.3, 300_000)
    assert (big.head_key_dim, big.head_value_dim) == (64, 64)
    assert (base.head_key_dim, base.label_smoothing, base.warmup_steps, base.beam_size) == (64, 0.1, 4000, 4)


def test_the_multi30k_preset_trains_small_and_decodes_with_its_own_length_penalty():
    """make demo's model keeps `small`'s shape and training (the speed benchmarks' fixed shape): only how it
    decodes was chosen on Multi30k's validation set."""
    small, multi30k = get_config("small").to_dict(), get_config("multi30k").to_dict()
    differing = {name for name in small if small[name] != multi30k[name]}
    assert differing == {"name", "alpha"}
    assert (multi30k["alpha"], multi30k["beam_size"]) == (2.0, 4)


def test_the_40_minute_recipe_is_multi30k_with_more_dropout():
    """benchmarks.quality's default: only the dropout rates differ from make demo's preset."""
    assert get_config("multi30k_40min") == get_config("multi30k").replace(
        name="multi30k_40min", dropout=0.2, attention_dropout=0.1, relu_dropout=0.1
    )


def test_configs_are_frozen_and_round_trip_json():
    config = get_config("small")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 1  # type: ignore[misc]
    assert TransformerConfig.from_json(config.to_json()) == config
    assert get_config("small", dropout=0.3).dropout == 0.3
    assert PRESETS["small"].dropout == 0.1  # overrides never mutate the preset


@pytest.mark.parametrize(
    "name,overrides,field",
    [
        ("base", {"d_model": 500}, "key_dim"),
        ("base", {"dropout": 1.5}, "dropout"),
        ("base", {"position": "rotary"}, "position"),
        ("base", {"num_layers": 0}, "num_layers"),
        ("tiny", {"train_steps": 0}, "train_steps"),  # the run settings are config fields (--set, or their flags)
        ("tiny", {"tokens_per_batch": -1}, "tokens_per_batch"),
    ],
)
def test_bad_values_name_the_field(name, overrides, field):
    with pytest.raises(ValueError, match=field):
        get_config(name, **overrides)


def test_unknown_names_are_rejected_clearly():
    with pytest.raises(ValueError, match="Unknown config 'huge'.*tiny, small, multi30k, multi30k_40min, base, big"):
        get_config("huge")
    with pytest.raises(ValueError, match="dmodel"):
        get_config("base", dmodel=3)


def test_overrides_parse_json_values_and_name_bad_fields():
    overrides = parse_overrides(["dropout=0.3", "position=learned", "pre_norm=true", "warmup_steps=800"])
    assert overrides == {"dropout": 0.3, "position": "learned", "pre_norm": True, "warmup_steps": 800}
    assert get_config("small", **overrides).warmup_steps == 800
    with pytest.raises(ValueError, match="'dropuot=0.3'.*dropout"):
        parse_overrides(["dropuot=0.3"])
    with pytest.raises(ValueError, match="'dropout'"):
        parse_overrides(["dropout"])

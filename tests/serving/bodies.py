"""Request bodies as clients send them, for property tests: bytes, not only what json.dumps writes.

A serialized value never holds what a client can write by hand (an integer of
5,000 digits, "NaN", a lone surrogate escape, a bare "-"), so a property test
that only serializes values cannot find the errors those raise.
"""

import json

from hypothesis import strategies as st


def json_texts():
    """JSON-like text, valid or nearly: numbers of any length (thousands of digits too), strings with any
    escapes, literals the JSON grammar has, Python's and broken ones, arrays and objects."""
    lengths = st.integers(1, 6000) | st.integers(4290, 4310)  # around Python's limit on int() of 4,300 digits
    digits = lengths.map(lambda n: "9" * n) | st.text("0123456789", min_size=1, max_size=30)
    integer = st.builds(lambda sign, whole: sign + whole, st.sampled_from(["", "-", "+"]), digits)
    number = integer | st.builds(
        lambda whole, fraction, exponent: whole + fraction + exponent,
        integer,
        st.sampled_from(["", ".", ".5"]) | digits.map(lambda d: "." + d),
        st.sampled_from(["", "e", "e-", "E+"]) | digits.map(lambda d: "e" + d),
    )
    string = st.text().map(json.dumps) | st.sampled_from(['"\\ud800"', '"\\x41"', '"\\u12"', '"open'])
    literal = st.sampled_from(["true", "false", "null", "NaN", "Infinity", "-Infinity", "nul", ""])
    return st.recursive(
        number | string | literal,
        lambda inner: (
            st.lists(inner, max_size=4).map(lambda items: "[" + ", ".join(items) + "]")
            | st.lists(st.tuples(string, inner), max_size=3).map(
                lambda pairs: "{" + ", ".join(f"{key}: {value}" for key, value in pairs) + "}"
            )
        ),
        max_leaves=12,
    )


def raw_bodies():
    """Request bodies as a client sends them: bytes, a predict request's shape around JSON-like text, or junk."""
    wrapped = st.builds(
        lambda head, text: (head + text + "}").encode("utf-8", "surrogatepass"),
        st.sampled_from(
            ['{"instances": ', '{"inputs": ', '{"signature_name": "translate_ids", "instances": ', '{"instances": [']
        ),
        json_texts(),
    )
    spliced = st.builds(
        lambda body, junk, at: body[:at] + junk + body[at:], wrapped, st.binary(max_size=8), st.integers(0, 60)
    )
    return wrapped | spliced | json_texts().map(lambda text: text.encode("utf-8", "surrogatepass")) | st.binary()

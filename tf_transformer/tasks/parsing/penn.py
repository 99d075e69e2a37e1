"""Raw English text as Penn Treebank tokens, in Python (nltk) and in the graph (for an export that parses raw text).

A parser reads the words of the treebank (section 6.3): ``ca n't``, ``-LRB-``,
quotes as ``````/``''``. :func:`penn_tokens` is nltk's ``TreebankWordTokenizer``
with ``convert_parentheses=True`` (what ``tft-parse`` runs on raw lines);
:func:`penn_tokenize` applies the same substitutions, in the same order, with
TensorFlow's regular-expression op, so a parser's export takes raw text and TF
Serving needs no tokenizer of its own. RE2 has no lookahead: nltk's one
(``wanna`` before a space) takes the space and puts it back. Every kind of
space is read as an ASCII space first, on both paths (RE2's ``\\s`` is ASCII).
RE2's ``\\d`` and ``\\b`` stay ASCII where Python's are Unicode: a contraction
glued to a non-ASCII letter (``écannot``) is split in the graph only, which the
treebank's English never shows (tests/tasks/test_penn.py checks the sample).
"""

from __future__ import annotations

import re

import tensorflow as tf

# Python's ``\s`` in text (str.isspace): what both tokenizers read as a space first (RE2's ``\s`` is ASCII only).
_WHITESPACE = "\t\n\v\f\r \x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_WHITESPACE_RE2 = (
    r"[\t\n\v\f\r \x{1c}-\x{1f}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}]"
)

# nltk 3.10's TreebankWordTokenizer.tokenize, step by step: (RE2 pattern, rewrite).
_BEFORE_PADDING = [
    # starting quotes
    (r'^"', "``"),
    (r"(``)", r" \1 "),
    (r"([ \(\[{<])(\"|'{2})", r"\1 `` "),
    # punctuation
    (r"([:,])([^\d])", r" \1 \2"),
    (r"([:,])$", r" \1 "),
    (r"\.\.\.", r" ... "),
    (r"[;@#$%&]", r" \0 "),
    (r"([^\.])(\.)([\]\)}>\"']*)\s*$", r"\1 \2\3 "),  # the final period
    (r"[?!]", r" \0 "),
    (r"([^'])' ", r"\1 ' "),
    # parentheses and brackets, then their treebank names
    (r"[\]\[\(\)\{\}<>]", r" \0 "),
    (r"\(", "-LRB-"),
    (r"\)", "-RRB-"),
    (r"\[", "-LSB-"),
    (r"\]", "-RSB-"),
    (r"\{", "-LCB-"),
    (r"\}", "-RCB-"),
    (r"--", r" -- "),
]
_AFTER_PADDING = [
    # ending quotes
    (r"''", " '' "),
    (r'"', " '' "),
    (r"([^' ])('[sS]|'[mM]|'[dD]|') ", r"\1 \2 "),
    (r"([^' ])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T) ", r"\1 \2 "),
    # Robert MacIntyre's contractions (nltk's CONTRACTIONS2 and 3)
    *[
        (rf"(?i)\b({first})({second})\b", r" \1 \2 ")
        for first, second in [("can", "not"), ("d", "'ye"), ("gim", "me"), ("gon", "na"), ("got", "ta")]
        + [("lem", "me"), ("more", "'n")]
    ],
    (r"(?i)\b(wan)(na)(\s)", r" \1 \2 \3"),
    (r"(?i) ('t)(is)\b", r" \1 \2 "),
    (r"(?i) ('t)(was)\b", r" \1 \2 "),
]


def penn_tokens(line: str) -> str:
    """``line`` tokenized as the Penn Treebank is (nltk), tokens joined by single spaces; every kind of space
    is read as an ASCII space and the line stripped first, as :func:`penn_tokenize` does."""
    from nltk.tokenize import TreebankWordTokenizer

    line = re.sub(f"[{_WHITESPACE}]", " ", line).strip(" ")
    return " ".join(TreebankWordTokenizer().tokenize(line, convert_parentheses=True))


def penn_tokenize(texts):
    """``string[batch]`` → the same, tokenized as :func:`penn_tokens` does, tokens joined by single spaces."""
    texts = tf.strings.strip(tf.strings.regex_replace(tf.convert_to_tensor(texts, tf.string), _WHITESPACE_RE2, " "))
    for pattern, rewrite in _BEFORE_PADDING:
        texts = tf.strings.regex_replace(texts, pattern, rewrite)
    texts = " " + texts + " "
    for pattern, rewrite in _AFTER_PADDING:
        texts = tf.strings.regex_replace(texts, pattern, rewrite)
    return tf.strings.reduce_join(tf.strings.split(texts), axis=-1, separator=" ")  # [batch]

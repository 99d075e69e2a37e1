"""Raw English text as Penn Treebank tokens, in Python (nltk) and in the graph (for an export that parses raw text).

A parser reads the words of the treebank (section 6.3): ``ca n't``, ``-LRB-``,
quotes as ``````/``''``. :func:`penn_tokens` is nltk's ``TreebankWordTokenizer``
with ``convert_parentheses=True`` (what ``tft-parse`` runs on raw lines);
:func:`penn_tokenize` applies the same substitutions, in the same order, with
TensorFlow's regular-expression op, so a parser's export takes raw text and TF
Serving needs no tokenizer of its own. RE2 has no lookahead: nltk's one
(``wanna`` before a space) takes the space and puts it back. RE2's ``\\d``,
``\\s`` and ``\\b`` are ASCII where Python's are Unicode, which the treebank's
English does not tell apart (checked on the sample's sentences: tests/tasks/test_penn.py).
"""

from __future__ import annotations

import tensorflow as tf

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
    """``line`` tokenized as the Penn Treebank is (nltk), tokens joined by single spaces."""
    from nltk.tokenize import TreebankWordTokenizer

    return " ".join(TreebankWordTokenizer().tokenize(line, convert_parentheses=True))


def penn_tokenize(texts):
    """``string[batch]`` → the same, tokenized as :func:`penn_tokens` does, tokens joined by single spaces."""
    texts = tf.convert_to_tensor(texts, tf.string)
    for pattern, rewrite in _BEFORE_PADDING:
        texts = tf.strings.regex_replace(texts, pattern, rewrite)
    texts = " " + texts + " "
    for pattern, rewrite in _AFTER_PADDING:
        texts = tf.strings.regex_replace(texts, pattern, rewrite)
    return tf.strings.reduce_join(tf.strings.split(texts), axis=-1, separator=" ")  # [batch]

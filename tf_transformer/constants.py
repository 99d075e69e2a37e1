"""The special token ids and the attention mask value: one definition for every package.

The SentencePiece vocabulary fixes the ids (``pipelines.vocab``): padding 0,
unknown 1, BOS 2, EOS 3. The model, the loss, the masks and the searches all
read them from here.
"""

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3

# Masked attention scores are replaced by this value *after* casting to float32, so
# the softmax gives padded keys a weight of exactly 0 under float16 and bfloat16 too
# (float16 cannot hold -1e9; adding a mask in float16 would overflow to -inf and
# turn fully masked rows into NaN).
MASK_VALUE = -1e9

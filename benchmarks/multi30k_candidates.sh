#!/usr/bin/env bash
# The runs behind the `multi30k` preset (docs/training.md#the-multi30k-recipe): each candidate
# trains within a CPU time budget and is scored on Multi30k's validation set only (the
# "test" split of benchmarks.quality is val here; test2016 is scored once, by multi30k.sh
# and make demo, for the preset chosen). Last line: one JSON object.
#
#   benchmarks/multi30k_candidates.sh small 2     # candidate, seed
#   .venv/bin/python -m benchmarks.decode_settings --model_dir runs/candidates/small_s2 \
#       --checkpoint runs/candidates/small_s2/averaged_5/ckpt --grid 4:0.6,4:1.0,4:1.4,4:1.7,4:2.0,5:2.0,4:2.3,4:3.0
#
# Candidates:
#   small     today's `small` at make demo's budget (18 minutes)
#   anchor    the fairseq transformer_tiny of Wu et al. (2021), 41.02 on test2016: d_model 128,
#             FFN 256, 4 heads, 4+4 layers, dropout 0.3, peak learning rate 0.005 after 2,000
#             updates (0.005 = 2.53 · 128^-0.5 · 2000^-0.5), at make demo's budget
#   anchor40  the same at benchmarks.quality's budget (40 minutes)
#   d02       `multi30k` with P_drop 0.2, at make demo's budget
#   d02_40    the same at 40 minutes
#   d02_ar40  `multi30k_40min`: P_drop 0.2 with attention and ReLU dropout 0.1, at 40 minutes
#   v5k40     the same with a 5,000-piece vocabulary (Sennrich and Zhang, 2019: smaller subword
#             vocabularies for low-resource translation), at 40 minutes
#   ls02_40   `multi30k_40min` with label smoothing 0.2 (section 5.4's ε_ls is 0.1), stopped at
#             the 3,569 updates `d02_ar40` made in 40 minutes on Intel AMX (seed 3): a seed's run
#             is bit-exact at equal updates, and the step costs the same, so no second baseline
#   ls03_40   the same with label smoothing 0.3
#   demo1541  `multi30k` (make demo's preset) stopped at the 1,541 updates make demo made in 18
#             minutes on Intel AMX (seed 1): make demo's budget, counted in updates
#   ls03      the same with label smoothing 0.3
#   ls02      the same with label smoothing 0.2
#   w300      `demo1541` with 300 warmup updates instead of 500 (a third of 1,541 updates is warmup)
#   w800      `demo1541` with 800 warmup updates: a lower peak (0.0018, not 0.0022), the same rate after
#   lr06      `demo1541` with learning_rate_scale 0.6, not 0.8: the whole schedule 0.75 times as high
set -euo pipefail
cd "$(dirname "$0")/.."
NAME="${1:?usage: benchmarks/multi30k_candidates.sh small|anchor|anchor40|d02|d02_40|d02_ar40|v5k40|ls02_40|ls03_40|demo1541|ls03|ls02|w300|w800|lr06 [SEED]}"
SEED="${2:-1}"
DATA="${DATA:-../shared/data/multi30k}"
if [ ! -d "$DATA" ]; then
  echo "multi30k_candidates.sh: $DATA not found (see ../shared/data/README.md)" >&2
  exit 2
fi
ANCHOR=(--config small --set d_model=128 --set d_ff=256 --set num_layers=4 --set num_heads=4
  --set dropout=0.3 --set warmup_steps=2000 --set learning_rate_scale=2.53)
# Equal updates, not minutes: this host class's count in the baseline's budget (see above).
AMX_40MIN=(--config multi30k_40min --set train_steps=3569 --minutes 90)
DEMO_UPDATES=(--config multi30k --set train_steps=1541 --minutes 60 --checkpoint_every 100)
case "$NAME" in
  small) FLAGS=(--config small --minutes 18 --checkpoint_every 100) ;;
  anchor) FLAGS=("${ANCHOR[@]}" --minutes 18) ;;
  anchor40) FLAGS=("${ANCHOR[@]}" --minutes 40) ;;
  d02) FLAGS=(--config multi30k --set dropout=0.2 --minutes 18 --checkpoint_every 100) ;;
  d02_40) FLAGS=(--config multi30k --set dropout=0.2 --minutes 40) ;;
  d02_ar40) FLAGS=(--config multi30k_40min --minutes 40) ;;
  v5k40) FLAGS=(--config multi30k_40min --vocab_size 5000 --minutes 40) ;;
  ls02_40) FLAGS=("${AMX_40MIN[@]}" --set label_smoothing=0.2) ;;
  ls03_40) FLAGS=("${AMX_40MIN[@]}" --set label_smoothing=0.3) ;;
  demo1541) FLAGS=("${DEMO_UPDATES[@]}") ;;
  ls03) FLAGS=("${DEMO_UPDATES[@]}" --set label_smoothing=0.3) ;;
  ls02) FLAGS=("${DEMO_UPDATES[@]}" --set label_smoothing=0.2) ;;
  w300) FLAGS=("${DEMO_UPDATES[@]}" --set warmup_steps=300) ;;
  w800) FLAGS=("${DEMO_UPDATES[@]}" --set warmup_steps=800) ;;
  lr06) FLAGS=("${DEMO_UPDATES[@]}" --set learning_rate_scale=0.6) ;;
  *) echo "multi30k_candidates.sh: unknown candidate $NAME (small, anchor, anchor40, d02, d02_40, d02_ar40, v5k40, ls02_40, ls03_40, demo1541, ls03, ls02, w300, w800, lr06)" >&2; exit 2 ;;
esac
make -s .venv/.installed
export TF_CPP_MIN_LOG_LEVEL=2
exec .venv/bin/python -m benchmarks.quality --data "$DATA" --src en --tgt de --dev val --test val --key val \
  --average 1,5,10 --seed "$SEED" --model_dir "runs/candidates/${NAME}_s${SEED}" "${FLAGS[@]}"

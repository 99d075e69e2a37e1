#!/usr/bin/env bash
# Multi30k quality bar (a benchmark, not a test): train the best CPU recipe for
# at most 40 minutes wall-clock, pick the checkpoint average on val, decode
# test_2016_flickr with beam search through the export. Last line: one JSON object.
#
#   benchmarks/multi30k.sh            # EN→DE
#   benchmarks/multi30k.sh de en      # DE→EN
#   benchmarks/multi30k.sh en de --minutes 10 --model_dir /tmp/try   # extra flags go to benchmarks.quality
#
# Same recipe on Tatoeba: DATA=../shared/data/tatoeba_en_de DEV=dev TEST=test KEY=test benchmarks/multi30k.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SRC="${1:-en}"
TGT="${2:-de}"
shift $(( $# < 2 ? $# : 2 ))
DATA="${DATA:-../shared/data/multi30k}"
if [ ! -d "$DATA" ]; then
  echo "multi30k.sh: $DATA not found (see ../shared/data/README.md, or run make demo to download Multi30k)" >&2
  exit 2
fi
make -s .venv/.installed
export TF_CPP_MIN_LOG_LEVEL=2
exec .venv/bin/python -m benchmarks.quality --data "$DATA" --src "$SRC" --tgt "$TGT" \
  --dev "${DEV:-val}" --test "${TEST:-test_2016_flickr}" --key "${KEY:-test2016}" \
  --config multi30k_40min --minutes 40 "$@"

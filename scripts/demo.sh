#!/usr/bin/env bash
# The main job end to end on this machine: 2-rank Horovod training on the
# real digits data. Run through `make demo`, which sets everything up first.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/demo}
rm -rf "$OUT" && mkdir -p "$OUT"

echo "== 1. train a CNN on 2 ranks (Horovod ring-allreduce over MPI)"
hvdk8s run -np 2 examples/train_digits.py --epochs 12 \
  --checkpoint-dir "$OUT/checkpoints" --save "$OUT/model.keras" --metrics-out "$OUT/metrics.json"

#!/usr/bin/env bash
# The main job end to end on this machine: 2-rank Horovod training on the
# real digits data, model selection, export for TensorFlow Serving, local
# serving and predictions on held-out images. Run through `make demo`, which
# sets everything up first.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/demo}
rm -rf "$OUT" && mkdir -p "$OUT"

echo "== 1. train a CNN on 2 ranks (Horovod ring-allreduce over MPI)"
hvdk8s run -np 2 examples/train_digits.py --epochs 12 \
  --checkpoint-dir "$OUT/checkpoints" --save "$OUT/model.keras" --metrics-out "$OUT/metrics.json"

echo "== 2. model selection: CNN vs CNN+dropout vs CNN+batchnorm, on 2 ranks each"
mkdir -p "$OUT/candidates" && cp "$OUT/model.keras" "$OUT/candidates/cnn.keras"
for variant in cnn_dropout cnn_bn; do
  hvdk8s run -np 2 examples/train_digits.py --epochs 12 --model "$variant" --save "$OUT/candidates/$variant.keras"
done

echo "== 3. promote the best to TensorFlow Serving version 1 (SavedModel; input: raw JPEG/PNG bytes)"
hvdk8s select "$OUT/candidates" --base-path "$OUT/models/digits" --class-names 0,1,2,3,4,5,6,7,8,9
saved_model_cli show --dir "$OUT/models/digits/1" --tag_set serve --signature_def serving_default

echo "== 4. serve it locally (TF Serving REST API) and classify held-out digit images (PNG and JPEG)"
python examples/serve_predict_demo.py "$OUT/models/digits" --images "$OUT/digit-images"

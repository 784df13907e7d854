#!/usr/bin/env bash
# The whole workflow end to end on this machine, as one pipeline: held-out
# data, three CNN candidates trained with Horovod on 2 ranks each, the best
# one selected and exported for TensorFlow Serving, served, load-tested, then
# used to classify held-out digit images. Run through `make demo`, which sets
# everything up first. The same pipeline file renders to an Argo Workflow:
#   hvdk8s pipeline render pipeline/examples/digits.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/demo}
rm -rf "$OUT" && mkdir -p "$OUT"

echo "== 1. the pipeline: ingest -> train 3 candidates -> select -> serve -> load test"
hvdk8s pipeline run pipeline/examples/digits.yaml --out "$OUT/pipeline"

echo "== 2. the served version (SavedModel; input: raw JPEG/PNG bytes)"
saved_model_cli show --dir "$OUT/pipeline/models/digits/1" --tag_set serve --signature_def serving_default

echo "== 3. serve it again and classify held-out digit images (PNG and JPEG)"
python examples/serve_predict_demo.py "$OUT/pipeline/models/digits" --images "$OUT/digit-images"

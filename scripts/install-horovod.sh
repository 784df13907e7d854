#!/usr/bin/env bash
# Build Horovod 0.28.1 against the TensorFlow already installed in a Python environment, and install it there.
#
#   bash scripts/install-horovod.sh                 the active virtual environment's python (else python3)
#   PYTHON=/path/to/python bash scripts/install-horovod.sh
#
# For users who bring their own TensorFlow (2.18-2.21): run this, then `pip install .` (or `pip install -e .`).
# Horovod is no longer released, and its last sdist does not build on TensorFlow 2.19+ as published: this
# downloads it from PyPI, checks its sha256, applies scripts/patches/horovod-0.28.1-tf2.21.patch (its header
# says what each hunk fixes) and builds a wheel with MPI and Gloo, plus NCCL when TensorFlow was built with
# CUDA. Needs Open MPI's headers, cmake, g++ and make (scripts/setup.sh installs them on Debian).
# The wheel is cached by Horovod version, patch hash, TensorFlow version, CPU/GPU and Python tag, so a rebuild
# happens only when one of those changes; a Horovod compiled for another TensorFlow is the classic
# undefined-symbol failure (`hvdk8s doctor` reports it).
#   HVDK8S_CACHE   wheel cache (default: ~/.cache/hvdk8s)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

HOROVOD_VERSION=0.28.1
HOROVOD_SDIST_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0
PATCH="$here/patches/horovod-0.28.1-tf2.21.patch"
CACHE=${HVDK8S_CACHE:-$HOME/.cache/hvdk8s}
if [ -z "${PYTHON:-}" ]; then
  if [ -n "${VIRTUAL_ENV:-}" ]; then PYTHON="$VIRTUAL_ENV/bin/python"; else PYTHON=python3; fi
fi

log() { printf '\033[1m[install-horovod]\033[0m %s\n' "$*"; }
die() { printf '[install-horovod] error: %s\n' "$*" >&2; exit 1; }

read -r TF_VERSION TF_KIND PY_TAG < <("$PYTHON" - <<'PY' 2>/dev/null
import sys
import tensorflow as tf
print(tf.__version__, "gpu" if tf.test.is_built_with_cuda() else "cpu", f"cp{sys.version_info[0]}{sys.version_info[1]}")
PY
) || die "TensorFlow does not import in $PYTHON: install TensorFlow 2.18-2.21 there first"
# Keyed by the hunks alone (from the first "diff" line): a change to the header's prose builds nothing.
PATCH_SHA=$(sed -n '/^diff /,$p' "$PATCH" | sha256sum | cut -c1-12)
WHEELS="$CACHE/wheels/horovod-$HOROVOD_VERSION-patch$PATCH_SHA-tf$TF_VERSION-$TF_KIND-$PY_TAG"
PIP=("$PYTHON" -m pip --disable-pip-version-check -q)

if ! ls "$WHEELS"/horovod-*.whl >/dev/null 2>&1; then
  for tool in mpicxx cmake g++ make patch; do
    command -v "$tool" >/dev/null || die "$tool not found: Horovod's build needs Open MPI headers (libopenmpi-dev), cmake, g++, make and patch"
  done
  log "building Horovod $HOROVOD_VERSION against TensorFlow $TF_VERSION ($TF_KIND; a few minutes, cached in $WHEELS)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "${PIP[@]}" download --no-deps --no-binary :all: -d "$tmp" "horovod==$HOROVOD_VERSION"
  echo "$HOROVOD_SDIST_SHA256  $tmp/horovod-$HOROVOD_VERSION.tar.gz" | sha256sum --check --quiet \
    || die "horovod-$HOROVOD_VERSION.tar.gz does not have the sha256 this script was written for"
  tar xzf "$tmp/horovod-$HOROVOD_VERSION.tar.gz" -C "$tmp"
  patch -s -p1 -d "$tmp/horovod-$HOROVOD_VERSION" < "$PATCH"
  gpu_ops=()
  [ "$TF_KIND" = gpu ] && gpu_ops=(HOROVOD_GPU_OPERATIONS=NCCL)
  env HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
      HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
      CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)" "${gpu_ops[@]}" \
      "${PIP[@]}" wheel --no-build-isolation --no-deps -w "$tmp/dist" "$tmp/horovod-$HOROVOD_VERSION"
  mkdir -p "$WHEELS"
  mv "$tmp"/dist/horovod-*.whl "$WHEELS"/
fi
log "installing Horovod from $WHEELS"
"${PIP[@]}" install --force-reinstall --no-deps "$WHEELS"/horovod-*.whl
# Horovod's own runtime dependencies (the wheel went in with --no-deps, so nothing else moves).
"${PIP[@]}" install cloudpickle psutil packaging cffi
"$PYTHON" - <<'PY'
import horovod, horovod.tensorflow as hvd, tensorflow as tf
print(f"[install-horovod] ok: Horovod {horovod.__version__} on TensorFlow {tf.__version__}: "
      f"mpi={hvd.mpi_built()} gloo={hvd.gloo_built()} nccl={hvd.nccl_built()}")
PY

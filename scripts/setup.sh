#!/usr/bin/env bash
# One idempotent set-up for a fresh machine: Debian packages (OpenMPI, ssh,
# iproute2), a virtual environment, TensorFlow + hvdk8s, and Horovod built from
# source against that TensorFlow. The Horovod wheel is cached outside the repo,
# keyed by Horovod, TensorFlow and Python versions, so CI builds it once.
#   HVDK8S_VENV   virtual environment (default: .venv in the repo)
#   HVDK8S_CACHE  wheel cache (default: ~/.cache/hvdk8s)
#   HVDK8S_TF_EXTRA  cpu (default) or gpu
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${HVDK8S_VENV:-.venv}
CACHE=${HVDK8S_CACHE:-$HOME/.cache/hvdk8s}
TF_EXTRA=${HVDK8S_TF_EXTRA:-cpu}
HOROVOD_VERSION=0.28.1
PYTHON=${PYTHON:-python3.11}
APT_PACKAGES=(libopenmpi-dev openmpi-bin openssh-client openssh-server iproute2 cmake g++ make)

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip setuptools wheel

log "installing hvdk8s[$TF_EXTRA,dev] (TensorFlow, Keras, mpi4py, kubernetes, ...)"
# mpi4py is built against the system Open MPI so both share one MPI library.
"${PIP[@]}" install --no-binary mpi4py -e ".[$TF_EXTRA,dev]"
# TF Serving's gRPC stubs; --no-deps: it requires the full `tensorflow` package (see pyproject.toml)
"${PIP[@]}" install --no-deps "tensorflow-serving-api==2.18.1"

TF_VERSION=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("tensorflow-cpu" if "'"$TF_EXTRA"'" == "cpu" else "tensorflow"))')
PY_TAG=$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
if "$VENV/bin/python" - <<PY 2>/dev/null
import importlib.metadata as m, horovod.tensorflow as hvd
assert m.version("horovod") == "$HOROVOD_VERSION"
assert hvd.mpi_built() and hvd.gloo_built()
PY
then
  log "Horovod $HOROVOD_VERSION already installed"
else
  WHEELS="$CACHE/wheels/horovod-$HOROVOD_VERSION-tf$TF_VERSION-$TF_EXTRA-$PY_TAG"
  if ! ls "$WHEELS"/horovod-*.whl >/dev/null 2>&1; then
    log "building Horovod $HOROVOD_VERSION against TensorFlow $TF_VERSION (a few minutes, cached in $WHEELS)"
    mkdir -p "$WHEELS"
    tmp=$(mktemp -d)
    gpu_ops=()
    [ "$TF_EXTRA" = gpu ] && gpu_ops=(HOROVOD_GPU_OPERATIONS=NCCL)
    env HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
        HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
        CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)" "${gpu_ops[@]}" \
        "$VENV/bin/python" -m pip --disable-pip-version-check -q wheel \
        --no-build-isolation --no-deps -w "$tmp" "horovod==$HOROVOD_VERSION"
    mv "$tmp"/horovod-*.whl "$WHEELS"/ && rm -rf "$tmp"
  fi
  log "installing cached Horovod wheel from $WHEELS"
  "${PIP[@]}" install --force-reinstall --no-deps "$WHEELS"/horovod-*.whl
  # Horovod's own runtime dependencies (its wheel was installed with --no-deps).
  "${PIP[@]}" install cloudpickle psutil packaging cffi
fi

"$VENV/bin/python" - <<'PY'
import horovod.tensorflow as hvd, tensorflow as tf, keras
print(f"[setup] ok: tensorflow {tf.__version__}, keras {keras.__version__}, "
      f"horovod mpi={hvd.mpi_built()} gloo={hvd.gloo_built()} nccl={hvd.nccl_built()}")
PY

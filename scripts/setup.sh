#!/usr/bin/env bash
# One idempotent set-up for a fresh machine: Debian packages (Open MPI, ssh, iproute2, the build tools),
# a virtual environment with one tested stack (scripts/stacks/tf-<version>.txt: TensorFlow, Keras, protobuf,
# TF Serving's API), hvdk8s, and Horovod built against that TensorFlow by scripts/install-horovod.sh
# (patched sdist, cached wheel).
#   HVDK8S_TF        the stack: 2.21 (default, newest) ... 2.18 (oldest supported)
#   HVDK8S_VENV      virtual environment (default: .venv in the repo)
#   HVDK8S_CACHE     wheel cache (default: ~/.cache/hvdk8s)
#   HVDK8S_TF_EXTRA  cpu (default) or gpu
set -euo pipefail
cd "$(dirname "$0")/.."

TF_STACK=${HVDK8S_TF:-2.21}
VENV=${HVDK8S_VENV:-.venv}
TF_EXTRA=${HVDK8S_TF_EXTRA:-cpu}
PYTHON=${PYTHON:-python3.11}
STACK=scripts/stacks/tf-$TF_STACK.txt
APT_PACKAGES=(libopenmpi-dev openmpi-bin openssh-client openssh-server iproute2 cmake g++ make patch wrk)

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

[ -f "$STACK" ] || { echo "[setup] error: HVDK8S_TF=$TF_STACK: no $STACK (stacks: $(cd scripts/stacks && ls | sed 's/^tf-//; s/\.txt$//' | tr '\n' ' '))" >&2; exit 2; }

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
# TensorFlow 2.18-2.21 and this venv want Python 3.11 (Debian 12's python3); elsewhere bring your own PYTHON.
if ! command -v "$PYTHON" >/dev/null; then
  [ "$PYTHON" = python3.11 ] || { echo "[setup] error: PYTHON=$PYTHON not found" >&2; exit 2; }
  missing+=(python3.11 python3.11-venv python3.11-dev)
fi
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || { echo "[setup] error: apt-get could not install ${missing[*]} (python3.11 comes with Debian 12; elsewhere set PYTHON to a Python 3.11)" >&2; exit 2; }
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip setuptools wheel

log "installing hvdk8s[$TF_EXTRA,dev] on the TensorFlow $TF_STACK stack ($STACK)"
# mpi4py is built against the system Open MPI so both share one MPI library.
"${PIP[@]}" install -c "$STACK" --no-binary mpi4py -e ".[$TF_EXTRA,dev]"
# TF Serving's gRPC stubs; --no-deps: it requires the full `tensorflow` package (see pyproject.toml)
"${PIP[@]}" install -c "$STACK" --no-deps tensorflow-serving-api

# Always: the wheel cache is keyed by the patch too, so an environment built with an older patch gets the
# current build (a cached wheel installs in seconds).
HVDK8S_CACHE=${HVDK8S_CACHE:-$HOME/.cache/hvdk8s} PYTHON="$VENV/bin/python" bash scripts/install-horovod.sh

if ! "$VENV/bin/python" -m hvdk8s.doctor --horovod-matches; then
  "$VENV/bin/python" -m hvdk8s.doctor >&2
  exit 1
fi
"$VENV/bin/python" - <<'PY'
import horovod.tensorflow as hvd, tensorflow as tf, keras
print(f"[setup] ok: tensorflow {tf.__version__}, keras {keras.__version__}, "
      f"horovod mpi={hvd.mpi_built()} gloo={hvd.gloo_built()} nccl={hvd.nccl_built()}")
PY

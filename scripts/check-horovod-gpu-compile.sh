#!/usr/bin/env bash
# Compile-only check of Horovod's GPU (CUDA + NCCL) code against a TensorFlow and CUDA 12 headers, on a
# machine with neither a GPU nor a CUDA 12 toolkit (Dockerfile.gpu's real build uses the nvidia/cuda devel
# image's nvcc instead). Minutes of compiling: not part of the test suite.
#
#   PYTHON=/path/to/venv/bin/python bash scripts/check-horovod-gpu-compile.sh
#
# In $WORK (default /tmp/hvdk8s-gpu-compile):
#  1. pip-installs (--target, not into $PYTHON) CUDA 12 component wheels and NCCL at the versions
#     Dockerfile.gpu installs (the floors of TensorFlow 2.21's [and-cuda] extra: CUDA 12.5.1's components,
#     NCCL 2.27.7) and lays them out as a CUDA tree: include/ (cuda_runtime.h, cuda.h, crt/ from the nvcc
#     wheel, nv/ cub/ thrust/ from cccl, nvtx3/, curand for clang's CUDA wrapper), bin/ptxas, nvvm/libdevice.
#  2. unpacks Horovod's sdist (sha256-checked) and applies scripts/patches/horovod-0.28.1-tf2.21.patch as
#     scripts/install-horovod.sh does, then any EXTRA_PATCHES (patch -p1 files, to try a change).
#  3. runs Horovod's own CMake configure with HOROVOD_GPU_OPERATIONS=NCCL and $PYTHON's TensorFlow.
#     CMake insists on an nvcc there; the pip wheels carry none (only ptxas), so configure uses $NVCC
#     (any version), and step 4 swaps that toolkit's include dir for the CUDA 12 tree's.
#  4. compiles every C++ translation unit with GPU code (GPU/NCCL sources, and files with
#     HAVE_GPU/HAVE_CUDA/HAVE_NCCL branches; ALL=1: every TU) with CMake's own command line.
#  5. compiles horovod/common/ops/cuda/cuda_kernels.cu with clang (a CUDA compiler that can use the
#     wheels' headers, ptxas and libdevice): host side, and device side for each of $CUDA_ARCHS.
#  6. link check (SYMBOLS=0 skips it): the TensorFlow/XLA symbols mpi_ops.cc and xla_mpi_ops.cc need must
#     be exported by the GPU wheel of $PYTHON's TensorFlow version (TF_GPU_WHEEL, else pip-downloaded,
#     ~600 MB); the CPU wheel's headers compile code that calls GPU-only functions, so compiling proves
#     nothing there (TensorFlow 2.21 dropped stream_executor::gpu::AsGpuStreamValue, which mpi_ops.cc calls).
# Exit status: the number of failures (0: all compiled and linked; 99: the set-up failed).
#   CUDA_WHEELS  the wheels (default: CUDA 12.5.1's runtime, nvcc, cccl, nvtx, curand; NCCL 2.27.7)
#   NVCC (nvcc on PATH); CLANG (clang++-19, Debian's clang-19: supports CUDA up to 12.5)
#   CUDA_ARCHS (70,75,80,86,89,90, as Dockerfile.gpu); HOROVOD_SDIST (a local sdist; else downloaded)
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}}; PYTHON=${PYTHON:-python3}
WORK=${WORK:-/tmp/hvdk8s-gpu-compile}
CUDA_WHEELS=${CUDA_WHEELS:-nvidia-cuda-runtime-cu12==12.5.82 nvidia-cuda-nvcc-cu12==12.5.82 nvidia-cuda-cccl-cu12==12.5.39.post1 nvidia-nvtx-cu12==12.5.82 nvidia-curand-cu12==10.3.6.82 nvidia-nccl-cu12==2.27.7}
NVCC=$(readlink -f "${NVCC:-$(command -v nvcc)}") || { echo "no nvcc for CMake's configure step" >&2; exit 99; }
CLANG=${CLANG:-clang++-19}
CUDA_ARCHS=${CUDA_ARCHS:-70,75,80,86,89,90}
HOROVOD_VERSION=0.28.1
SDIST_SHA256=$(sed -n 's/^HOROVOD_SDIST_SHA256=//p' "$here/install-horovod.sh")
PATCHES=("$here/patches/horovod-0.28.1-tf2.21.patch")
for p in ${EXTRA_PATCHES:-}; do PATCHES+=("$(readlink -f "$p")"); done
log() { printf '\033[1m[gpu-compile]\033[0m %s\n' "$*"; }
mkdir -p "$WORK" && cd "$WORK" || exit 99

# 1. CUDA 12 + NCCL from PyPI, as a CUDA tree.
WHEELS=$WORK/wheels-$(echo "$CUDA_WHEELS" | sha256sum | cut -c1-12)
if [ ! -f "$WHEELS/.done" ]; then
  log "pip: $CUDA_WHEELS"
  # shellcheck disable=SC2086
  "$PYTHON" -m pip install -q --disable-pip-version-check --no-deps --target "$WHEELS" $CUDA_WHEELS || exit 99
  touch "$WHEELS/.done"
fi
W=$WHEELS/nvidia
CUDA=$WORK/cuda-12
rm -rf "$CUDA" && mkdir -p "$CUDA/include" "$CUDA/bin" "$CUDA/nvvm"
for inc in "$W"/*/include; do
  [ "$inc" = "$W/nccl/include" ] && continue  # NCCL goes in through HOROVOD_NCCL_INCLUDE, as in the image
  (cd "$inc" && find . -name __pycache__ -prune -o -type f ! -name __init__.py -print \
     | while read -r f; do mkdir -p "$CUDA/include/$(dirname "$f")" && ln -sf "$inc/$f" "$CUDA/include/$f"; done)
done
ln -s "$W/cuda_nvcc/bin/ptxas" "$CUDA/bin/ptxas" && ln -s "$W/cuda_nvcc/nvvm/libdevice" "$CUDA/nvvm/libdevice"
ln -sf libnccl.so.2 "$W/nccl/lib/libnccl.so"   # CMake's find_library wants the unversioned name

# 2. The patched sdist (one source tree per set of patches).
SRC=$WORK/src-$(cat "${PATCHES[@]}" | sha256sum | cut -c1-12)/horovod-$HOROVOD_VERSION
if [ ! -f "$SRC/.patched" ]; then
  SDIST=${HOROVOD_SDIST:-}
  if [ -z "$SDIST" ]; then
    "$PYTHON" -m pip download -q --no-deps --no-binary :all: -d "$WORK" "horovod==$HOROVOD_VERSION" || exit 99
    SDIST=$WORK/horovod-$HOROVOD_VERSION.tar.gz
  fi
  echo "$SDIST_SHA256  $SDIST" | sha256sum --check --quiet || exit 99
  rm -rf "$SRC" && mkdir -p "$(dirname "$SRC")" && tar xzf "$SDIST" -C "$(dirname "$SRC")" || exit 99
  for p in "${PATCHES[@]}"; do log "patch: $p"; patch -s -p1 -d "$SRC" < "$p" || exit 99; done
  touch "$SRC/.patched"
fi

# 3. Horovod's CMake configure, as its setup.py runs it, with the GPU/NCCL settings of Dockerfile.gpu.
log "cmake configure (nvcc for configure only: $NVCC; TensorFlow from $PYTHON)"
rm -rf build && mkdir -p build/obj && cd build || exit 99
env HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="$(dirname "$(dirname "$NVCC")")" HOROVOD_BUILD_CUDA_CC_LIST="$CUDA_ARCHS" \
    HOROVOD_NCCL_INCLUDE="$W/nccl/include" HOROVOD_NCCL_LIB="$W/nccl/lib" HOROVOD_NCCL_LINK=SHARED \
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
    CMAKE_POLICY_VERSION_MINIMUM=3.5 \
  cmake "$SRC" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPYTHON_EXECUTABLE:FILEPATH="$PYTHON" \
    -DCMAKE_EXPORT_COMPILE_COMMANDS=ON > cmake.log 2>&1 || { tail -30 cmake.log; exit 99; }
grep -E 'HVD_NVCC_COMPILE_FLAGS|NCCL_VERSION_CODE|Found Tensorflow' cmake.log | sed 's/^/  /'

# 4. C++ TUs with CMake's command lines, the configure toolkit's include dir replaced by the CUDA 12 tree.
TOOLKIT_INC=$(sed -n 's/^CUDAToolkit_INCLUDE_DIR:[A-Z]*=//p' CMakeCache.txt)
"$PYTHON" - "$SRC" "$TOOLKIT_INC" "$CUDA/include" "${ALL:-0}" > commands.sh <<'PY' || exit 99
import json, os, re, shlex, sys
src, old_inc, new_inc, everything = sys.argv[1], os.path.realpath(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
gpu_sources = re.compile(r"(gpu|cuda|nccl)_operations\.cc$")
seen = set()
for entry in json.load(open("compile_commands.json")):
    path = os.path.realpath(entry["file"])
    if not path.endswith(".cc") or path in seen or "third_party" in path:
        continue
    seen.add(path)  # a TU can be in two targets (ABI-compatible variants); compile it once
    if not (everything or gpu_sources.search(path) or re.search(r"HAVE_(GPU|CUDA|NCCL)", open(path).read())):
        continue
    args = shlex.split(entry["command"])
    args = [new_inc if os.path.realpath(a) == old_inc else a for a in args]
    args = [a.replace(old_inc + "/", new_inc + "/") if a.startswith(old_inc + "/") else a for a in args]
    assert not any(old_inc in a for a in args), path
    args[args.index("-o") + 1] = os.path.abspath("obj/" + os.path.relpath(path, src).replace("/", "_") + ".o")
    print(f"cd {shlex.quote(entry['directory'])} && {shlex.join(args)}\t{os.path.relpath(path, src)}")
PY
first=$(head -1 commands.sh | cut -f1 | sed 's/ -o .*//')
log "CUDA 12 tree as the C++ TUs see it:"
printf '#include <cuda.h>\n#include <cuda_runtime_api.h>\n#include <nccl.h>\n' \
  | eval "${first#*&& } -E -dM -x c++ -" | grep -E '#define (CUDA_VERSION|CUDART_VERSION|NCCL_VERSION_CODE) ' | sed 's/^/  /'
run() {  # $1: label, rest: the command; prints OK/FAIL and the first error lines
  local label=$1 out; shift
  if out=$("$@" 2>&1); then log "OK   $label"; else log "FAIL $label"; grep -m5 -E 'error|fatal' <<<"$out" | sed 's/^/    /'; return 1; fi
}
log "compiling $(wc -l < commands.sh) C++ TUs with $(awk '{print $4; exit}' commands.sh), $(nproc) at a time"
i=0
while IFS=$'\t' read -r cmd label; do
  i=$((i + 1))
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n; done
  { run "$label" bash -c "$cmd" > "tu.$i.log"; echo $? > "tu.$i.rc"; } &
done < commands.sh
wait
fail=0
for j in $(seq "$i"); do cat "tu.$j.log"; [ "$(cat "tu.$j.rc")" = 0 ] || fail=$((fail + 1)); done

# 5. cuda_kernels.cu with clang against the CUDA 12 tree (host side; device side: ptxas from the wheel).
CU=$SRC/horovod/common/ops/cuda/cuda_kernels.cu
CLANG_ARGS=(-x cuda --cuda-path="$CUDA" -std=c++11 -O3 -fPIC -D_GLIBCXX_USE_CXX11_ABI=1
            -DHAVE_CUDA=1 -DHAVE_GPU=1 -DHAVE_NCCL=1 -I"$SRC" -c -o /dev/null "$CU")
log "cuda_kernels.cu with $("$CLANG" --version | head -1)"
run "cuda_kernels.cu host side" "$CLANG" --cuda-host-only --cuda-gpu-arch=sm_70 "${CLANG_ARGS[@]}" || fail=$((fail + 1))
for cc in ${CUDA_ARCHS//,/ }; do
  run "cuda_kernels.cu device side sm_$cc (clang -> PTX -> the wheel's ptxas)" \
    "$CLANG" --cuda-device-only --cuda-gpu-arch="sm_$cc" "${CLANG_ARGS[@]}" || fail=$((fail + 1))
done

# 6. TensorFlow symbols of the TF-facing objects, against the GPU wheel's exported ones.
if [ "${SYMBOLS:-1}" = 1 ]; then
  TF_VERSION=$("$PYTHON" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null)
  WHL=${TF_GPU_WHEEL:-}
  if [ -z "$WHL" ]; then
    "$PYTHON" -m pip download -q --no-deps --only-binary :all: -d "$WORK/tf-gpu" "tensorflow==$TF_VERSION" || exit 99
    WHL=$(ls "$WORK/tf-gpu/tensorflow-$TF_VERSION"-*.whl)
  fi
  unzip -q -o "$WHL" tensorflow/libtensorflow_framework.so.2 tensorflow/libtensorflow_cc.so.2 -d tf-gpu || exit 99
  nm -D --defined-only tf-gpu/tensorflow/*.so.2 | awk 'NF == 3 {sub(/@.*/, "", $3); print $3}' | sort -u > exports.txt
  for o in obj/horovod_tensorflow_mpi_ops.cc.o obj/horovod_tensorflow_xla_mpi_ops.cc.o; do
    [ -f "$o" ] || continue
    nm -u "$o" | awk '{print $2}' | sort -u | comm -23 - exports.txt | c++filt \
      | grep -E '^((vtable|typeinfo|typeinfo name) for )?(tensorflow|xla|tsl|stream_executor)::' > "$o.missing"
    if [ -s "$o.missing" ]; then
      log "FAIL $(basename "$o"): $(wc -l < "$o.missing") symbols not exported by $(basename "$WHL"):"
      sed 's/^/    /' "$o.missing"; fail=$((fail + 1))
    else
      log "OK   $(basename "$o"): every TensorFlow/XLA symbol it needs is exported by $(basename "$WHL")"
    fi
  done
fi
log "$fail failed"
exit "$fail"

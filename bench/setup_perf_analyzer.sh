#!/usr/bin/env bash
# Fetch Triton's own load generator for the benchmark cross-check (see shared FACTS: the binary inside
# the tritonclient 2.51.0 manylinux1 wheel runs here given libb64 and the CUDA runtime library).
set -euo pipefail
PY=${PYTHON:-python3}
case "$PY" in */*) case "$PY" in /*) ;; *) PY="$PWD/$PY" ;; esac ;; esac
cd "$(dirname "$0")"
TOOLS=.tools
[ -x "$TOOLS/perf_analyzer" ] && [ -f "$TOOLS/lib/libcudart.so.12" ] && exit 0
mkdir -p "$TOOLS/lib" "$TOOLS/wheels"
if ! ldconfig -p | grep -q libb64.so.0d; then
  (apt-get install -y -q libb64-0d || (apt-get update -q && apt-get install -y -q libb64-0d)) >/dev/null
fi
$PY -m pip download -q --no-deps --only-binary=:all: --platform manylinux1_x86_64 tritonclient==2.51.0 -d "$TOOLS/wheels"
$PY -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 nvidia-cuda-runtime-cu12 -d "$TOOLS/wheels"
$PY - "$TOOLS" <<'PYEOF'
import glob, os, sys, zipfile
tools = sys.argv[1]
with zipfile.ZipFile(glob.glob(f"{tools}/wheels/tritonclient-2.51.0-*.whl")[0]) as wheel:
    open(f"{tools}/perf_analyzer", "wb").write(wheel.read("tritonclient-2.51.0.data/data/bin/perf_analyzer"))
os.chmod(f"{tools}/perf_analyzer", 0o755)
with zipfile.ZipFile(glob.glob(f"{tools}/wheels/nvidia_cuda_runtime_cu12-*.whl")[0]) as wheel:
    open(f"{tools}/lib/libcudart.so.12", "wb").write(wheel.read("nvidia/cuda_runtime/lib/libcudart.so.12"))
PYEOF
rm -rf "$TOOLS/wheels"
LD_LIBRARY_PATH="$TOOLS/lib" "$TOOLS/perf_analyzer" --version

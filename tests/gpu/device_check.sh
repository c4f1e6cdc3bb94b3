#!/usr/bin/env bash
# Runs both GPU checks on a machine with an NVIDIA GPU, from a bundle made by `make gpu-bundle`
# on the build machine (build/gpu-bundle travels, with the Python package; the source tree
# gives torch_check.py). Prints the figures and writes them into OUT (default: /tmp).
#   bash tests/gpu/device_check.sh [BUNDLE] [OUT]
# kvpool-gpu-check runs with the whole bundle on its library path. The Python check loads
# libkvpool into PyTorch's interpreter, so it gets only the bundled libraries the machine
# lacks: a bundled copy of a library the machine has could shadow the newer one PyTorch needs.
set -uo pipefail
bundle=$(realpath "${1:-build/gpu-bundle}")
out=${2:-/tmp}
here=$(dirname "$(realpath "$0")")
mkdir -p "$out"

nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current \
  --format=csv,noheader 2>&1 | tee "$out/gpu.txt"

echo "== kvpool-gpu-check"
LD_LIBRARY_PATH=$bundle timeout 300 "$bundle/kvpool-gpu-check" --kvpoold "$bundle/kvpoold" \
  --reps "${REPS:-2}" ${GPU_CHECK_ARGS:-} 2>&1 \
  | grep -v -E '^(20[0-9][0-9]-|kvpoold: )' | tee "$out/gpu_check.txt"

echo "== torch_check.py"
lib=$(mktemp -d)
cp "$bundle/libkvpool.so.1" "$lib/"
for f in "$bundle"/lib*.so*; do
  name=$(basename "$f")
  [ "$name" = libkvpool.so.1 ] && continue
  ldconfig -p | grep -q "^[[:space:]]*$name " || cp "$f" "$lib/"
done
PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=$lib timeout 240 python3 "$here/torch_check.py" \
  --kvpoold "$bundle/kvpoold" --lib "$lib/libkvpool.so.1" --python "$bundle/python" 2>&1 | tee "$out/torch_check.txt"

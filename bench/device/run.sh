#!/usr/bin/env bash
# The device check of docs/gpu.md, in one call on a machine lent through the device tool (carry .device, made
# by bench/device/pack.sh): installs the carried wheels (no registry there), runs the gpu test tier, then
# bench/gpu_batch.py at 60,000 Fashion-MNIST rows, and leaves in $OUT what the session copies back:
# gpu_batch.json (for bench/results/), gpu.md (docs/gpu.md with the measured table) and the logs.
#   what: all (default) | tests | bench     SMALL=1: bench/gpu_batch.py --small (a dry run, on a CPU too)
set -uo pipefail
cd "$(dirname "$0")/../.."
what=${1:-all}
OUT=${OUT:-/tmp/device-out}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 DO_NOT_TRACK=true
if ! "$PY" -c "import pydantic, pandera" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --find-links .device/wheels pydantic pandera 2>&1 | tail -3
fi
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" | tee "$OUT/device.txt"
rc=0
if [ "$what" = all ] || [ "$what" = tests ]; then
  "$PY" -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -5
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
  opts=(--docs); [ "${SMALL:-0}" = 1 ] && opts=(--small)  # a dry run leaves docs/gpu.md as it is
  fashion=.device/fashion-mnist; [ -d "$fashion" ] || fashion=/usr/share/datasets/fashion-mnist
  "$PY" bench/gpu_batch.py "${opts[@]}" --fashion-dir "$fashion" --out "$OUT/gpu_batch.json" 2>&1 \
    | tee "$OUT/gpu_batch.log" | tail -8
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  cp docs/gpu.md "$OUT/gpu.md"
fi
exit $rc

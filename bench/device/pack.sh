#!/usr/bin/env bash
# Packs what a device machine lacks into .device/ (git-ignored, about 34 MB): the wheels the core needs beyond
# the device image's torch, numpy and pandas (pydantic, pandera and their pure-Python dependencies, built for its
# Python 3.12 on x86-64), and the Fashion-MNIST IDX files (Debian package dataset-fashion-mnist). A session lent a
# device then runs bench/device/run.sh there in one call, carrying .device (docs/gpu.md, "Measuring on a device").
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
FASHION=${FASHION:-/usr/share/datasets/fashion-mnist}
rm -rf .device.tmp && mkdir -p .device.tmp/wheels .device.tmp/fashion-mnist
"$PY" -m pip download -q -d .device.tmp/wheels --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --implementation cp "pydantic==2.14.4" "pandera==0.35.*" "typeguard" \
  "typing_extensions>=4.16" "annotated-types" "typing-inspection"
if ! ls "$FASHION"/train-images-idx3-ubyte* >/dev/null 2>&1; then
  echo "error: no Fashion-MNIST IDX files in $FASHION: install the Debian package dataset-fashion-mnist, or set FASHION" >&2
  exit 2
fi
cp "$FASHION"/*-idx?-ubyte* .device.tmp/fashion-mnist/
rm -rf .device && mv .device.tmp .device  # whole or not at all
echo "packed .device ($(du -sh .device | cut -f1)): $(ls .device/wheels | wc -l) wheels, $(ls .device/fashion-mnist | wc -l) IDX files"

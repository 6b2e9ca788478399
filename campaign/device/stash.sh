#!/usr/bin/env bash
# On the GPU node, step 1 of 2 (campaign/device/pack.sh made .device/a): keep the first part
# of the model's weights in /tmp, where run.sh (step 2) finds it.
set -euo pipefail
cd "${ROOT:-$(dirname "$0")/../..}"   # ROOT: another checkout (the tests use one)
stash=${STASH:-/tmp/aclpipe-device}
mkdir -p "$stash"
cp .device/a/model.safetensors.part-a "$stash/"
echo "stashed $(stat -c %s "$stash/model.safetensors.part-a") bytes in $stash; now run.sh, at once"

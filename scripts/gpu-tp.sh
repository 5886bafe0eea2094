#!/usr/bin/env bash
# Issue 11: every GPU of the machine loads its tensor-parallel share of one
# model through the node at once (scripts/gpu-tp.py), vs safetensors + slicing.
# Run ON a GPU machine from the repository root after `make build gpu-build`;
# carry bin and .gpu. SIZE (default 4GiB), REPS (default 3).
set -uo pipefail
export PYTHONUNBUFFERED=1
k=$PWD/.gpu/kylix
work=$(mktemp -d /var/tmp/kylix-tp.XXXX)
node=
trap '[ -n "$node" ] && { kill -TERM $node; wait $node; }; rm -rf "$work"' EXIT
export KYLIX_DATA=$work/data
$k demo-model --size "${SIZE:-4GiB}" "$work/src" >/dev/null
$k import "$work/src/base" m | tail -1
setsid $k serve --mount "$work/mnt" --client-socket "$work/client.sock" > "$work/serve.log" 2>&1 &
node=$!
for _ in $(seq 1 300); do [ -f "$work/mnt/m/config.json" ] && break; sleep 0.1; done
[ -f "$work/mnt/m/config.json" ] || { cat "$work/serve.log"; exit 1; }
cat "$work"/mnt/m/*.safetensors > /dev/null   # the packs' first-open check, before timing
pinned=()
# With pins built (kylix pin), the model is measured pinned as well.
$k pin --help >/dev/null 2>&1 && pinned=(--pinned "$k" pin m)
python3 scripts/gpu-tp.py --reps "${REPS:-3}" --mount-files "$work"/mnt/m/*.safetensors --source-files "$work"/src/base/*.safetensors "${pinned[@]}"
rc=$?
$k node | grep -E "clients|gpu|filled" || true
grep -E "CUDA context" "$work/serve.log" | cut -c1-160 || true
exit $rc

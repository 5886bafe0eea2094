#!/usr/bin/env bash
# A fine-tune deduplicated against its base, read warm through the mount,
# against its backing files (issue 22, item 4; docs/design/whole.md), side
# by side in one run, before whole copies (--whole-budget 0: the node serves
# every read) and with them (passthrough). Run ON the GPU machine (or any
# Linux machine with FUSE, as root) from the repository root after
# `make gpu-build` here; no Go or GPU needed. With the device tool:
#   run(command="bash scripts/gpu-whole.sh", carry=[".gpu"])
# `kylix demo-model --size SIZE` (default 4GiB) writes a base and a
# fine-tune (about 10% of the tensor bytes changed, headers of another
# length); both are imported. Each figure is the median of REPS (default 5)
# alternating passes over the fine-tune's shards in 1 MiB reads: from the
# source files (the backing files, same disk) and through the mount. Ends
# with "WHOLE PASSED" or "WHOLE FAILED".
set -uo pipefail
out=${OUT:-/tmp/kylix-whole-out}; mkdir -p "$out"
k=$PWD/.gpu/kylix
size=${SIZE:-4GiB}
reps=${REPS:-5}
die() { echo "FAILED: $*"; echo; echo "WHOLE FAILED"; exit 1; }
[ -x "$k" ] || die "$k missing: run 'make gpu-build' first and carry .gpu"
work=$(mktemp -d /var/tmp/kylix-whole.XXXX)
export KYLIX_DATA=$work/data
mnt=$work/mnt
. scripts/lib/node.sh
trap 'stop_node; rm -rf "$work"' EXIT
$k demo-model --size "$size" "$work/src" | tail -1 || die "demo-model"
$k import "$work/src/base" models/base | tail -1 || die "import base"
$k import "$work/src/finetuned" models/ft | tail -1 || die "import fine-tune"
mkdir -p "$mnt"
start() { start_node "$mnt/models/ft/config.json" --client-socket none "$@"; }
shards=$(cd "$work/src/finetuned" && ls *.safetensors)
passes() { # label: REPS alternating passes, backing then mount; prints GB/s per pass
  python3 - "$1" "$reps" "$work/src/finetuned" "$mnt/models/ft" $shards <<'PY'
import os, statistics, sys, time
label, reps, src, mnt, names = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
buf = bytearray(1 << 20); mv = memoryview(buf)
def one(d):
    t, n = time.perf_counter(), 0
    for name in names:
        with open(os.path.join(d, name), "rb", buffering=0) as f:
            while True:
                k = f.readinto(mv)
                if not k:
                    break
                n += k
    return n / (time.perf_counter() - t) / 1e9
one(src); one(mnt)  # warm both
b, m = [], []
for _ in range(reps):
    b.append(one(src)); m.append(one(mnt))
mb, mm = statistics.median(b), statistics.median(m)
print(f"{label}: mount {mm:.2f} GB/s ({', '.join('%.2f' % x for x in m)}), backing {mb:.2f} GB/s ({', '.join('%.2f' % x for x in b)}): {mm/mb:.2f}x")
PY
}

echo "== before: --whole-budget 0 (the node serves the fine-tune)"
start --whole-budget 0
passes "served by the node" || die "passes"
stop_node

echo "== whole copies (default --whole-budget)"
start
for f in $shards; do cat "$mnt/models/ft/$f" > /dev/null; cat "$mnt/models/ft/$f" > /dev/null; done
n=$(echo $shards | wc -w)
for _ in $(seq 1 600); do
  made=$($k node --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["whole"]["made"])')
  [ "$made" -ge "$n" ] && break; sleep 0.5
done
$k node | grep -A1 '^whole:'
[ "$made" -ge "$n" ] || die "$made of $n shards got a whole copy"
for f in $shards; do # not piped into grep -q: its early exit would fail the pipe (pipefail)
  $k stat "models/ft/$f" > "$out/stat.txt" && grep -q "a whole copy" "$out/stat.txt" || die "kylix stat models/ft/$f names no whole copy"
done
for f in $shards; do cmp "$mnt/models/ft/$f" "$work/src/finetuned/$f" || die "$f differs through the mount"; done
pt0=$($k node --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["fs"]["passthrough_opens"])')
passes "whole copies (passthrough)" || die "passes"
pt1=$($k node --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["fs"]["passthrough_opens"])')
[ "$pt1" -gt "$pt0" ] || die "the reads were not passthrough"
$k du models | tail -3
echo; echo "WHOLE PASSED"

#!/usr/bin/env bash
# safetensors.torch.load_file(device="cuda:0") of a transformers checkpoint
# through the Kylix mount vs the same files on local disk, side by side in one
# run, cold (page cache dropped) and warm. Run ON the GPU machine from the
# repository root after `make gpu-build` (device tool: carry .gpu); also run
# at the end of scripts/gpu-bench.sh. Goal (issue 7): mount >= 0.9x local,
# cold and warm.
#
# The checkpoint is made here with transformers' own save_pretrained (safetensors
# shards of 2 GB) from a Llama config of about 1.9 B parameters in bf16, with
# random weights and the norm weights at 1.0 as a fresh model has them.
# Every tensor loaded through the mount is compared with the local one.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/kylix-bench-out}; mkdir -p "$out"
k=$PWD/.gpu/kylix
work=${WORK:-/var/tmp/kylix-mbench}; reps=${REPS:-3}
export KYLIX_DATA=$work/data
mnt=$work/mnt; src=$work/ckpt
j=$out/mount.jsonl; : > "$j"
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
mkdir -p "$work" "$mnt"
if [ ! -f "$src/config.json" ]; then
  python3 "$here/make_llama.py" "$src" || exit 1
fi
$k import "$src" models/ckpt | tail -2
setsid $k serve --mount "$mnt" > "$out/serve.log" 2>&1 &
node=$!
for _ in $(seq 1 300); do [ -f "$mnt/models/ckpt/config.json" ] && break; sleep 0.1; done
[ -f "$mnt/models/ckpt/config.json" ] || { echo "node did not mount"; cat "$out/serve.log"; exit 1; }
python3 -c 'import os,sys; [print(os.path.basename(f), os.getxattr(f, "user.kylix.path").decode()) for f in sys.argv[1:]]' "$mnt"/models/ckpt/*.safetensors
loc=$(ls "$src"/*.safetensors); via=$(ls "$mnt"/models/ckpt/*.safetensors)
rec() { echo "{\"what\":\"$1\",\"state\":\"$2\",\"r\":$3}" >> "$j"; }
for i in $(seq 1 $reps); do
  drop; rec local cold "$(python3 "$here/st_load.py" $loc)"
  drop; rec mount cold "$(python3 "$here/st_load.py" $via)"
done
cat $loc $via > /dev/null
for i in $(seq 1 $reps); do
  rec local warm "$(python3 "$here/st_load.py" $loc)"
  rec mount warm "$(python3 "$here/st_load.py" $via)"
done
python3 - "$src" "$mnt/models/ckpt" <<'PY'
import sys, os, torch
from safetensors.torch import load_file
bad = 0; n = 0
for f in sorted(os.listdir(sys.argv[1])):
    if not f.endswith(".safetensors"): continue
    a = load_file(os.path.join(sys.argv[1], f), device="cuda:0"); b = load_file(os.path.join(sys.argv[2], f), device="cuda:0")
    for k in a:
        n += 1
        if k not in b or not torch.equal(a[k], b[k]): bad += 1
print(f"tensors compared: {n}, different: {bad}")
sys.exit(1 if bad or not n else 0)
PY
cmp_rc=$?
kill -TERM $node; wait $node
python3 - "$j" <<'PY'
import json, sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    d = json.loads(line); rows.setdefault((d["what"], d["state"]), []).append(d["r"]["gb_per_s"])
print("\n| safetensors.load_file(cuda:0) | state | runs | median GB/s | all runs |")
print("|---|---|---|---|---|")
for (w, s), v in rows.items():
    print("| %s | %s | %d | %.2f | %s |" % (w, s, len(v), st.median(v), ", ".join("%.2f" % x for x in v)))
for s in ("cold", "warm"):
    m, l = st.median(rows[("mount", s)]), st.median(rows[("local", s)])
    print(f"{s}: mount / local disk = {m/l:.3f} (goal >= 0.9)")
PY
exit $cmp_rc

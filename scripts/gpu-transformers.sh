#!/usr/bin/env bash
# transformers from_pretrained of a generated Llama (about 1.9 B parameters,
# bf16, save_pretrained's 2 GB safetensors shards) onto cuda:0, side by side
# in one run: from local disk, through the Kylix mount, and through the mount
# with the LD_PRELOAD shim (bin/libkylix_preload.so, where built), cold (page
# cache dropped) and warm, each in a fresh process; the logits of every load
# must equal those from local disk (issue 8, items 6 and 7). Run ON the GPU
# machine from the repository root after `make build gpu-build`; carry bin
# and .gpu. REPS (default 3). Ends "TRANSFORMERS CHECK PASSED" or FAILED.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
k=$PWD/.gpu/kylix
shim=$PWD/bin/libkylix_preload.so
reps=${REPS:-3}
work=$(mktemp -d /var/tmp/kylix-hf.XXXX)
node=
trap '[ -n "$node" ] && { kill -TERM $node; wait $node; }; rm -rf "$work"' EXIT
export KYLIX_DATA=$work/data PYTHONUNBUFFERED=1
src=$work/ckpt mnt=$work/mnt
python3 "$here/make_llama.py" "$src" || exit 1
$k import "$src" models/llama | tail -1
setsid $k serve --mount "$mnt" --client-socket "$work/client.sock" > "$work/serve.log" 2>&1 &
node=$!
for _ in $(seq 1 300); do [ -f "$mnt/models/llama/config.json" ] && break; sleep 0.1; done
[ -f "$mnt/models/llama/config.json" ] || { cat "$work/serve.log"; exit 1; }
cat "$mnt"/models/llama/*.safetensors > /dev/null   # the packs' first-open check, before timing
python3 "$here/hf_load.py" "$src" --save "$work/ref.pt" > /dev/null || exit 1
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
ways=(local mount)
[ -f "$shim" ] && ways+=(shim) || echo "no $shim: the shim row is not measured"
j=$work/rows.jsonl
for state in cold warm; do
  [ $state = warm ] && cat "$src"/*.safetensors "$mnt"/models/llama/*.safetensors > /dev/null
  for i in $(seq 1 "$reps"); do
    for w in "${ways[@]}"; do
      [ $state = cold ] && drop
      case $w in
        local) r=$(python3 "$here/hf_load.py" "$src" --ref "$work/ref.pt") ;;
        mount) r=$(python3 "$here/hf_load.py" "$mnt/models/llama" --ref "$work/ref.pt") ;;
        shim)  r=$(KYLIX_PRELOAD_STATS=$work/stats.json LD_PRELOAD=$shim python3 "$here/hf_load.py" "$mnt/models/llama" --ref "$work/ref.pt")
               r="${r%\}}, \"preload\": $(cat "$work/stats.json" 2>/dev/null || echo null)}" ;;
      esac
      echo "{\"way\": \"$w\", \"state\": \"$state\", \"r\": $r}" | tee -a "$j"
    done
  done
done
python3 - "$j" <<'PY'
import json, sys, statistics as st
rows, ok = {}, True
for line in open(sys.argv[1]):
    d = json.loads(line)
    rows.setdefault((d["way"], d["state"]), []).append(d["r"]["seconds"])
    ok &= d["r"].get("equal", False)
print("\n| from_pretrained onto cuda:0 | state | median s | runs |\n|---|---|---|---|")
for (w, s), v in rows.items():
    print(f"| {w} | {s} | {st.median(v):.3f} | {', '.join(f'{x:.3f}' for x in v)} |")
for s in ("cold", "warm"):
    loc = st.median(rows[("local", s)])
    for w in ("mount", "shim"):
        if (w, s) in rows:
            print(f"{s}: {w} {loc / st.median(rows[(w, s)]):.2f}x local disk (goal >= 1.0x with the shim)")
print("TRANSFORMERS CHECK", "PASSED" if ok else "FAILED: logits differ from local disk")
sys.exit(0 if ok else 1)
PY

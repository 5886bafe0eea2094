set -uo pipefail
k=$PWD/.gpu/kylix
work=$(mktemp -d /var/tmp/kylix-tp.XXXX)
export KYLIX_DATA=$work/data
$k demo-model --size 4GiB "$work/src" >/dev/null
$k import "$work/src/base" m | tail -1
setsid $k serve --mount "$work/mnt" --client-socket "$work/client.sock" > "$work/serve.log" 2>&1 &
node=$!
for _ in $(seq 1 300); do [ -f "$work/mnt/m/config.json" ] && break; sleep 0.1; done
cat "$work"/mnt/m/*.safetensors > /dev/null
ls -la $work/mnt/m
nvidia-smi topo -m
python3 scripts/gpu-tp-diag.py --files "$work"/mnt/m/*.safetensors --reps 2
$k node
kill -TERM $node; wait $node
grep -v "level=DEBUG" $work/serve.log | tail -30
rm -rf $work

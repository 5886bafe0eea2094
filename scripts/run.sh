#!/usr/bin/env bash
# make run: Kylix's main job on the embedded default — one node on the
# default data directory, mounted at the default mount point, with a generated
# sample model imported. The node keeps running in the background; the script
# says where it is mounted and how to stop it. $KYLIX_DATA and $KYLIX_MOUNT
# choose the data directory and mount point, as for kylix serve.
set -euo pipefail
cd "$(dirname "$0")/.."
kylix=$PWD/bin/kylix
# The data directory: $KYLIX_DATA, else kylix's documented default (read from
# the serve command's own help, so the two never disagree).
data=${KYLIX_DATA:-$($kylix serve --help 2>&1 | sed -n 's/.*data directory.*(default "\(.*\)").*/\1/p')}
export KYLIX_DATA=$data
mkdir -p "$data"
log=$data/kylix-serve.log

if $kylix node >/dev/null 2>&1; then
  echo "== a node already serves $data"
else
  echo "== starting a node on $data (log: $log)"
  nohup "$kylix" serve >"$log" 2>&1 &
  for _ in $(seq 1 100); do
    $kylix node >/dev/null 2>&1 && break
    if ! kill -0 $! 2>/dev/null; then echo "the node exited:"; tail -20 "$log"; exit 1; fi
    sleep 0.1
  done
fi
mnt=$($kylix node --json | sed -n 's/.*"mount": *"\([^"]*\)".*/\1/p')
pid=$($kylix node --json | sed -n 's/.*"pid": *\([0-9]*\).*/\1/p')

src=$data/demo-src
if [ ! -d "$src/base" ]; then
  echo "== generating the sample model (64 MiB per version) in $src"
  $kylix demo-model --size 64MiB "$src"
fi
echo "== importing it (through the node)"
$kylix import "$src/base" models/demo-llama
$kylix import "$src/finetuned" models/demo-llama-ft
echo "== kylix df"
$kylix df
echo "== the mount: ls -l $mnt/models/demo-llama"
ls -l "$mnt/models/demo-llama"
echo "== sha256sum through the mount vs the source"
(cd "$mnt/models/demo-llama" && sha256sum model-00001-of-00002.safetensors)
(cd "$src/base" && sha256sum model-00001-of-00002.safetensors)
cat <<MSG

Kylix node running in the background: pid $pid, data $data, mounted at $mnt
  try:   ls $mnt/models; bin/kylix stat models/demo-llama/model-00001-of-00002.safetensors; bin/kylix node
  stop:  kill $pid        (it commits open writes and unmounts; bin/kylix node shows the pid again)
While it runs, another kylix serve on $data or $mnt fails ("a node already serves",
"already a mount point"); the README's tour (bash scripts/tour.sh) uses its own.
(\$KYLIX_DATA and \$KYLIX_MOUNT choose others.)
MSG

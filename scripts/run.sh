#!/usr/bin/env bash
# make run: Kylix's main job on the embedded default — one node, the default
# data directory, the sample model imported.
set -euo pipefail
cd "$(dirname "$0")/.."
kylix=bin/kylix
# The data directory: $KYLIX_DATA, else kylix's documented default.
data=$($kylix df --json | sed -n 's/.*"data_dir": "\(.*\)".*/\1/p')
src=$data/demo-src
mkdir -p "$data"
if [ ! -d "$src/base" ]; then
  echo "== generating the sample model (64 MiB per version) in $src"
  $kylix demo-model --size 64MiB "$src"
fi
echo "== importing it into the store at $data"
$kylix import "$src/base" models/demo-llama
$kylix import "$src/finetuned" models/demo-llama-ft
echo "== kylix ls -R models"
$kylix ls -R models
echo "== kylix df"
$kylix df

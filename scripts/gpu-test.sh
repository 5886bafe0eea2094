#!/usr/bin/env bash
# The GPU suite, run ON the GPU machine from the repository root after
# `make gpu-build` here (which puts static binaries in .gpu/). With the device
# tool: run(command="bash scripts/gpu-test.sh", carry=[".gpu"]).
# Every path the machine offers is checked byte for byte (copy back, compare).
set -uo pipefail
export KYLIX_REQUIRE_GPU=1
out=${OUT:-/tmp/kylix-gpu-out}; mkdir -p "$out"
k=./.gpu/kylix
fail=0
step() { echo; echo "== $*"; }
step "machine"; nvidia-smi -L; uname -r
step "cuda package tests"; ./.gpu/cuda.test -test.count=1 2>&1 | tail -15 || fail=1
step "gpublake3 (BLAKE3 on the GPU vs zeebo)"; ./.gpu/gpublake3.test -test.count=1 2>&1 | tail -5 || fail=1
step "gpuio GPU tests (every path, every byte)"
./.gpu/gpuio.test -test.run 'GPU' -test.v -test.count=1 > "$out/gpuio.txt" 2>&1 || { echo "gpuio GPU tests FAILED"; fail=1; }
grep -E '^(=== RUN|--- |ok|FAIL|PASS)|->|not available' "$out/gpuio.txt" | head -40
step "interop with the reference implementations (safetensors, transformers; CI has neither)"
for t in safetensors demomodel; do
  r=$(./.gpu/$t.test -test.run Interop -test.v -test.count=1 2>&1); echo "$r" | grep -E '^(--- |ok|FAIL|PASS)|reference' | head -5
  echo "$r" | grep -q -- '--- PASS' || { echo "$t interop did not pass"; fail=1; }
done
step "kylix doctor"; $k doctor | tee "$out/doctor.txt"
work=$(mktemp -d /var/tmp/kylix-gpu-test.XXXX)
export KYLIX_DATA=$work/data
$k demo-model --size ${TEST_SIZE:-512MiB} "$work/src" >/dev/null
$k import "$work/src/base" models/base >/dev/null
$k import "$work/src/finetuned" models/ft >/dev/null
step "kylix load --check (copy back, compare every byte)"
for args in "" "--io direct" "--io buffered" "--io mapped" "--tp-size 2 --tp-rank 1" "--tp-size 4 --tp-rank 3 --io mapped" "--reader io_uring --io direct" "--files 1" "--verify-on cpu" "--verify-on device --io buffered" "--path gds-compat"; do
  echo "-- load $args"
  if ! $k load --device cuda:0 --check $args models/base models/ft > "$out/load.txt" 2>&1; then
    if [ "$args" = "--path gds-compat" ]; then tail -3 "$out/load.txt"; else cat "$out/load.txt"; fail=1; fi
  else
    grep -E '^(device|total)' "$out/load.txt"
  fi
done
echo "-- strict gds (must fail with a reason where GDS is unavailable)"
$k load --device cuda:0 --path gds --strict models/base 2>&1 | tail -1
step "kylix load through a running node (the node's CUDA context, none in the CLI)"
mkdir -p "$work/mnt"
$k serve --mount "$work/mnt" --client-socket none > "$out/serve.txt" 2>&1 &
serve=$!
for i in $(seq 100); do $k node >/dev/null 2>&1 && break; sleep 0.1; done
# No GPU is visible to the CLI: the load passes only if the node does it.
if CUDA_VISIBLE_DEVICES= $k load --device cuda:0 --check --tp-size 2 --tp-rank 0 models/base > "$out/load-node.txt" 2>&1; then
  grep -E '^(device|total)' "$out/load-node.txt"
else
  echo "load through the node FAILED"; cat "$out/load-node.txt"; tail -5 "$out/serve.txt"; fail=1
fi
kill -TERM $serve; wait $serve || { echo "serve did not stop cleanly"; tail -5 "$out/serve.txt"; fail=1; }
rm -rf "$work"
step "result"; if [ $fail = 0 ]; then echo "GPU SUITE PASSED"; else echo "GPU SUITE FAILED"; fi
exit $fail

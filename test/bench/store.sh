#!/usr/bin/env bash
# Store benchmarks (issue 2), measured side by side in one run on this machine:
#   import  vs  cp -r + sync  vs  hashing alone on all cores   (same files, same disk)
#   export (read back, every chunk verified)  vs  reading the source files
#   dedup: base + finetuned stored bytes / one version, vs plain 64 KiB CDC (Xet)
# Medians of COUNT runs (default 5). Needs bin/kylix (make build).
set -euo pipefail
cd "$(dirname "$0")/../.."
count=${COUNT:-5}
size=${SIZE_MIB:-512}
out=$(mktemp -d /var/tmp/kylix-store-bench.XXXX)
trap 'rm -rf "$out"' EXIT
export KYLIX_BENCH_DIR=$out KYLIX_BENCH_SIZE_MIB=$size
echo "== go test ./chunkstore -bench Store (model ${size} MiB per version, count $count)"
go test ./chunkstore -run '^$' -bench 'Store' -benchtime 1x -count "$count" | tee "$out/bench.txt" | grep -E '^Benchmark'
python3 - "$out/bench.txt" <<'PY'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r'Benchmark(\S+?)-\d+\s+\d+\s+\d+ ns/op\s+([\d.]+) MB/s', line)
    if m: runs.setdefault(m.group(1), []).append(float(m.group(2)))
med = {k: statistics.median(v) for k, v in runs.items()}
print("\n| benchmark | median MB/s | runs |\n|---|---|---|")
for k, v in runs.items():
    print(f"| {k} | {med[k]:.0f} | {', '.join(f'{x:.0f}' for x in v)} |")
imp, cp, h = med["StoreImport"], med["StoreCp"], med["StoreHashAllCores"]
print(f"\nimport / (cp -r + sync) = {imp/cp:.2f}; import / hash-all-cores = {imp/h:.2f}; "
      f"import / min(both) = {imp/min(cp, h):.2f} (goal >= 0.8); import / cp -r without sync = {imp/med['StoreCpNoSync']:.2f}")
print(f"export / read-source = {med['StoreExport']/med['StoreReadSource']:.2f}")
PY
echo
echo "== dedup through the CLI: import base, then finetuned"
k=bin/kylix
$k demo-model --size "${size}MiB" "$out/pair" > /dev/null
export KYLIX_DATA=$out/data
$k import --json "$out/pair/base" models/base > "$out/base.json"
$k import --json "$out/pair/finetuned" models/ft > "$out/ft.json"
$k df --json > "$out/df.json"
python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
b, f, df = (json.load(open(f"{d}/{n}.json")) for n in ("base", "ft", "df"))
print(f"one version: {b['bytes']} bytes; finetuned new {f['new_bytes']}, deduplicated {f['dedup_bytes']}")
print(f"unique_bytes {df['unique_bytes']} = {df['unique_bytes']/b['bytes']:.4f}x one version; "
      f"stored_bytes (pack files) {df['stored_bytes']} = {df['stored_bytes']/b['bytes']:.4f}x (goal <= 1.12x)")
PY
echo
echo "== the same pair cut by plain content-defined chunking (chunkstore/chunking TestMeasureDedup)"
go test ./chunkstore/chunking -run TestMeasureDedup -v -demosize "$size" 2>&1 | grep -E '^\s*\|' || true

#!/usr/bin/env bash
# Runs every benchmark script in test/bench (make bench).
set -euo pipefail
cd "$(dirname "$0")"
for s in *.sh; do
	[ "$s" = run.sh ] && continue
	echo "== $s"
	bash "$s"
done

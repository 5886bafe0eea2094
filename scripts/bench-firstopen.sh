#!/bin/bash
# First read of a 1 GiB file through the mount after a node start, as after
# a reboot (no record of checked packs, page cache dropped), against a
# later cold read (node running, check recorded) and dd of the pack itself.
# Root (drop_caches, FUSE). Usage: scripts/bench-firstopen.sh KYLIX RUNS [serve flags]
# Prints one line per run in GB/s (docs/bench.md, "First read after a start").
set -eu
X=$1 RUNS=$2; shift 2
W=$(mktemp -d /tmp/kylix-firstopen.XXXXXX)
D=$W/data M=$W/mnt P=
cleanup() { [ -n "$P" ] && kill -TERM $P 2>/dev/null && wait $P; rm -rf "$W"; }
trap cleanup EXIT
mkdir -p $D $M
head -c $((1 << 30)) /dev/urandom >$W/big.bin
"$X" import --data $D $W/big.bin m/big.bin >/dev/null 2>&1
rm $W/big.bin
PACK=$("$X" stat --data $D m/big.bin | sed -n 's/^whole-file pack: \([^ ]*\).*/\1/p')
rd() { local s=$(date +%s.%N); dd if="$1" of=/dev/null bs=16M 2>/dev/null || { echo FAIL; return; }
	local e=$(date +%s.%N); python3 -c "import sys; print('%.3f' % (1.073741824 / (float(sys.argv[2]) - float(sys.argv[1]))))" "$s" "$e"; }
cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }
for r in $(seq $RUNS); do
	rm -f $D/verified-packs.json # as after a reboot
	cold
	"$X" serve --data $D --mount $M --client-socket none "$@" >$W/serve.log 2>&1 &
	P=$!
	for i in $(seq 100); do [ -f $M/m/big.bin ] && break; sleep 0.1; done
	first=$(rd $M/m/big.bin)
	for i in $(seq 600); do grep -q '"file"' $D/verified-packs.json 2>/dev/null && break; sleep 0.1; done
	cold
	later=$(rd $M/m/big.bin)
	path=$(getfattr --only-values -n user.kylix.path $M/m/big.bin 2>/dev/null || true)
	kill -TERM $P; wait $P || true; P=
	cold
	raw=$(rd $PACK)
	echo "run $r: first=$first later_cold=$later pack_dd=$raw GB/s (then: $path)"
done

#!/usr/bin/env bash
# The README's short tour, run as written: the lines between BEGIN TOUR and
# END TOUR are the README's tour block, command for command and in order
# (test/tour_test.go checks both ways, and runs this script in CI against
# freshly built binaries). Lines starting with tour_ are this script's own:
# they wait for a node to answer, and say why a step is skipped. A line
# prefixed "tour_if NEED" is the README's line, run when NEED is here.
#
#   make build && bash scripts/tour.sh
#
# It makes its own data directory and mount point (KYLIX_DATA and
# KYLIX_MOUNT under a mktemp -d directory), so it leaves a node started by
# make run alone. The part from `serve` on needs root and /dev/fuse; load
# needs an NVIDIA GPU; without them those steps are skipped, saying so.
# Whatever happens, it stops the nodes it started, clears their mounts
# (also one left by a node that died) and removes its files.
#
# KYLIX_TOUR_BIN=DIR: run the kylix (and libkylix_preload.so) in DIR
# instead of the repository's bin/.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${KYLIX_TOUR_BIN:-$repo/bin}
[ -x "$bin/kylix" ] || { echo "tour: no $bin/kylix: run make build first" >&2; exit 1; }

# The tour runs in a directory of its own whose bin/ is $bin, so that its
# lines read as in the README (bin/kylix, $PWD/bin/...).
W=$(mktemp -d -t kylix-tour-run.XXXXXX)
T=""
pids=()
socks=()
cleanup() {
  local rc=$? p m i
  trap - DEBUG
  set +e
  # The last started first, one at a time: a member that leaves while the
  # one it joined is still there is not kept waiting for its leave to be
  # heard (serf waits 5 s for that).
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    p=${pids[i]}
    kill -TERM "$p" 2>/dev/null
    for _ in $(seq 200); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
  done
  wait 2>/dev/null
  # A node that did not stop cleanly (killed, crashed) leaves its client
  # socket (in /run/kylix as root).
  for p in "${socks[@]}"; do [ ! -S "$p" ] || rm -f "$p"; done
  if [ -n "$T" ]; then
    # Every mount under $T: also one whose node died (ENOTCONN, which
    # mountpoint -q does not see as a mount).
    while read -r m; do
      umount -l "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null || echo "tour: could not unmount $m" >&2
    done < <(awk -v t="$T/" 'index($5, t) == 1 { print $5 }' /proc/self/mountinfo)
    rm -rf "$T"
  fi
  rm -rf "$W"
  [ -z "$T" ] || echo "tour: removed $T${pids[*]:+, stopped node ${pids[*]}}"
  if [ "$rc" = 0 ]; then echo "tour: passed${skipped:+; skipped: ${skipped#; }}"; else echo "tour: FAILED (exit $rc)" >&2; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
skipped=""
mkdir "$W/bin"
for f in "$bin"/kylix "$bin"/libkylix*.so; do [ -e "$f" ] && ln -s "$f" "$W/bin/"; done
cd "$W"

# tour_skip WHAT WHY: say a step is skipped and why (also in the last line).
tour_skip() { echo "tour: skipped: $1: $2"; skipped+="; $1: $2"; }

# tour_has NEED: whether NEED is here; else the reason on stdout.
tour_has() {
  case $1 in
  fuse)
    [ "$(id -u)" = 0 ] || { echo "kylix serve mounts with FUSE: needs root"; return 1; }
    [ -e /dev/fuse ] || { echo "no /dev/fuse (apt-get install fuse3)"; return 1; } ;;
  gpu)
    [ -e /dev/nvidia0 ] || { echo "no NVIDIA GPU here (/dev/nvidia0)"; return 1; } ;;
  torch)
    /usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "no torch for /usr/bin/python3 (apt-get install python3-torch; scripts/test-deps.sh)"; return 1; } ;;
  attr)
    command -v getfattr >/dev/null || { echo "no getfattr (apt-get install attr)"; return 1; } ;;
  preload)
    [ -e bin/libkylix_preload.so ] || { echo "no bin/libkylix_preload.so (make build builds it with a C compiler)"; return 1; } ;;
  pins)
    local l
    l=$(bin/kylix doctor 2>/dev/null | grep -E '^no +pins ') || return 0
    echo "kylix pin cannot lock memory here: $(echo "${l#no}" | sed 's/^ *pins *//')"
    return 1 ;;
  esac
}

# tour_needs NEED: go on only where NEED is here: the rest of the tour is
# skipped otherwise (the tour passes, saying so).
tour_needs() {
  local why
  why=$(tour_has "$1") && return 0
  tour_skip "the rest of the tour" "$why"
  return 1
}

# tour_if NEED CMD...: run the README's line CMD where NEED is here. A
# missing test client (torch, attr, the preload library) fails the tour
# unless KYLIX_TEST_ALLOW_SKIP=1, as in the tests (internal/testneeds);
# what the machine cannot do (pins: no memory locking) is skipped, saying so.
tour_if() {
  local need=$1 why
  shift
  if why=$(tour_has "$need"); then
    echo "\$ $*" >&2
    env "$@"
  elif [ "$need" = pins ] || [ "${KYLIX_TEST_ALLOW_SKIP:-}" = 1 ]; then
    tour_skip "$*" "$why"
  else
    echo "tour: missing client: $why (KYLIX_TEST_ALLOW_SKIP=1 skips this step)" >&2
    return 1
  fi
}

# tour_started DATA: the node just started in the background on DATA: wait
# until it answers (it is stopped at the end).
tour_started() {
  pids+=("$!")
  local p=$! data=$1
  for _ in $(seq 300); do
    if bin/kylix node --data "$data" --json >"$W/node.json" 2>/dev/null; then
      socks+=("$(sed -n 's/^ *"socket": *"\(.*\)",*$/\1/p' "$W/node.json" | head -1)")
      return 0
    fi
    kill -0 "$p" 2>/dev/null || { echo "tour: the node on $data exited" >&2; return 1; }
    sleep 0.1
  done
  echo "tour: the node on $data did not answer in 30 s" >&2
  return 1
}

# tour_until CMD...: wait (up to 30 s) until CMD succeeds: a member sees a
# path once the namespace merge has carried it there.
tour_until() {
  for _ in $(seq 300); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "tour: still failing after 30 s: $*" >&2
  "$@"
}

# Each line of the tour is shown before it runs (the DEBUG trap is not
# inherited by the functions above, so their insides are not).
trap '[[ $BASH_COMMAND == tour_* || $BASH_COMMAND == return* || $BASH_COMMAND == exit* ]] || echo "\$ $BASH_COMMAND"' DEBUG
# BEGIN TOUR
T=$(mktemp -d); export KYLIX_DATA=$T/data KYLIX_MOUNT=$T/mnt
bin/kylix demo-model --size 64MiB $T/demo
bin/kylix import $T/demo/base models/llama
bin/kylix import $T/demo/finetuned models/llama-ft
bin/kylix ls -R models
bin/kylix stat models/llama/model-00001-of-00002.safetensors
bin/kylix df
bin/kylix verify
bin/kylix fsck
bin/kylix export models/llama-ft $T/out
diff -r $T/demo/finetuned $T/out
bin/kylix rm -r models/llama-ft && bin/kylix gc
bin/kylix du models
bin/kylix doctor
tour_needs fuse || exit 0
bin/kylix serve &
tour_started $KYLIX_DATA
bin/kylix node
sha256sum $KYLIX_MOUNT/models/llama/*.safetensors
tour_if torch /usr/bin/python3 -c 'import os, torch; p = os.environ["KYLIX_MOUNT"] + "/ckpt.pt"; torch.save({"w": torch.ones(3)}, p); print(torch.load(p))'
tour_if preload LD_PRELOAD=$PWD/bin/libkylix_preload.so KYLIX_PRELOAD_STATS=$T/preload.json cat $KYLIX_MOUNT/models/llama/model-00001-of-00002.safetensors | cmp - $T/demo/base/model-00001-of-00002.safetensors
tour_if preload cat $T/preload.json
tour_if attr getfattr -n user.kylix.path $KYLIX_MOUNT/models/llama/model-00001-of-00002.safetensors
bin/kylix top --count 2
bin/kylix warm models/llama
tour_if pins bin/kylix pin models/llama
bin/kylix ls models/llama
bin/kylix cluster-key > $T/k && chmod 600 $T/k
bin/kylix serve --data $T/a --mount $T/ma --listen 127.0.0.2:7946 --cluster-key $T/k &
tour_started $T/a
bin/kylix serve --data $T/b --mount $T/mb --listen 127.0.0.3:7946 --cluster-key $T/k --join 127.0.0.2:7946 &
tour_started $T/b
bin/kylix import --data $T/a $T/demo/base models/llama
tour_until cmp $T/demo/base/config.json $T/mb/models/llama/config.json
bin/kylix peers --data $T/b
tour_if pins bin/kylix pin --data $T/b models/llama
bin/kylix stat --data $T/b models/llama/model-00001-of-00002.safetensors
tour_needs gpu || exit 0
bin/kylix load --device cuda:0 models/llama
bin/kylix load --device cuda:0 --tp-size 2 --tp-rank 1 models/llama
bin/kylix layout --tp-size 2 models/llama
# END TOUR

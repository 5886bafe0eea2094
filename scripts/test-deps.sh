#!/usr/bin/env bash
# Installs the real clients the tests need, where missing: fuse3, C and C++
# compilers, Debian's python3-torch, python3-numpy and python3-venv, setpriv,
# mkfs.ext4 and systemd-analyze, ip, tc, nsenter and nft (network-namespace
# tests; nft adds packet loss), getfattr (attr: the README's tour,
# scripts/tour.sh). Idempotent: with everything present it installs nothing and
# asks no registry. `make test` and .ci/run run it first.
#
# As root where apt-get is, it installs what is missing. Elsewhere it names
# what is missing and fails, unless KYLIX_TEST_ALLOW_SKIP=1: then the tests
# that need a missing client skip, saying so (internal/testneeds).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v c++ >/dev/null 2>&1 || need+=(g++)
/usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1 || need+=(python3-torch python3-numpy)
/usr/bin/python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
command -v setpriv >/dev/null 2>&1 && command -v prlimit >/dev/null 2>&1 && command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || need+=(iproute2)
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
command -v getfattr >/dev/null 2>&1 || need+=(attr)
if [ ${#need[@]} -eq 0 ]; then
  echo "test clients: all present"
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "test clients: installing ${need[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  exit 0
fi
msg="test clients missing: ${need[*]} (install them: sudo apt-get install -y --no-install-recommends ${need[*]}, or run sudo make test)"
if [ "${KYLIX_TEST_ALLOW_SKIP:-}" = 1 ]; then
  echo "$msg; KYLIX_TEST_ALLOW_SKIP=1: the tests that need them skip"
  exit 0
fi
echo "$msg; KYLIX_TEST_ALLOW_SKIP=1 lets those tests skip instead" >&2
exit 1

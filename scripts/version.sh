#!/usr/bin/env bash
# Prints the -ldflags that stamp kylix's version into the binary (make build
# passes them): -X main.version=VERSION -X main.revision=COMMIT
# -X main.buildTime=TIME, and -X main.modified=true for a tree with
# uncommitted changes. VERSION is the release tag (v*) at COMMIT, else a
# pseudo-version in Go's own form, v0.0.0-YYYYMMDDHHMMSS-COMMIT12, the one
# `go build` stamps itself when it records the VCS (GOFLAGS=-buildvcs=false
# turns that off, and a tarball has no .git).
#
# In a git checkout it asks git. In a tarball made by `git archive` the
# line below was filled in by git (export-subst, .gitattributes); with
# neither it prints nothing, and kylix --version says devel.
set -euo pipefail
cd "$(dirname "$0")/.."
archived='$Format:%H %ct$'
if rev=$(git rev-parse HEAD 2>/dev/null); then
  ts=$(git show -s --format=%ct HEAD)
  tag=$(git describe --tags --exact-match --match 'v[0-9]*' HEAD 2>/dev/null || true)
  modified=false
  [ -z "$(git status --porcelain --untracked-files=no 2>/dev/null | head -1)" ] || modified=true
elif [ "${archived#\$Format}" = "$archived" ]; then
  read -r rev ts <<<"$archived"
  tag=""
  modified=false
else
  exit 0
fi
when=$(date -u -d "@$ts" +%Y%m%d%H%M%S)
version=${tag:-v0.0.0-$when-${rev:0:12}}
[ "$modified" = false ] || version+="+dirty"
flags="-X main.version=$version -X main.revision=$rev -X main.buildTime=$(date -u -d "@$ts" +%Y-%m-%dT%H:%M:%SZ)"
[ "$modified" = false ] || flags+=" -X main.modified=true"
echo "$flags"

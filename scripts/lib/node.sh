# Helpers for the GPU-machine scripts that start and stop one kylix node
# (sourced: `. scripts/lib/node.sh`). The caller sets k (the kylix binary),
# mnt (the mount point), out (where serve.log goes) and defines die.

node=

# start_node READY_FILE [serve flags...]: starts `kylix serve --mount $mnt`
# with the flags, in its own session, and waits (30 s) for READY_FILE (a
# path under the mount) to appear.
start_node() {
  local ready=$1; shift
  setsid $k serve --mount "$mnt" "$@" >> "$out/serve.log" 2>&1 &
  node=$!
  for _ in $(seq 1 300); do [ -e "$ready" ] && break; sleep 0.1; done
  [ -e "$ready" ] || { tail -20 "$out/serve.log"; die "the node did not come up"; }
}

# stop_node: SIGTERM (the node commits and unmounts), SIGKILL after 10 s,
# then detaches the mount if it is still there.
stop_node() {
  if [ -n "$node" ] && kill -0 "$node" 2>/dev/null; then
    kill -TERM "$node"; for _ in $(seq 1 100); do kill -0 "$node" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$node" 2>/dev/null
  fi
  node=
  umount -l "$mnt" 2>/dev/null
}

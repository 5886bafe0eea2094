// Package test holds Kylix's suites that drive real processes: the kylix
// binary as a node (kylix serve) with its FUSE mount, real clients (cp, cmp,
// sha256sum, PyTorch, numpy) reading and writing through it, and fault
// tests that kill the node with SIGKILL and check the store afterwards.
//
// They need root and /dev/fuse (CI has both) and skip with the reason
// otherwise. The binary is built once per run (or taken from $KYLIX_BIN).
package test

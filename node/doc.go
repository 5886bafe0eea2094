// Package node is a running Kylix node as a library: the store of one data
// directory, its FUSE mount, the admin socket the CLI talks to (typed
// requests, adminproto.go), the client socket any local process may use
// (pack fds, GPU fills by the node), pins, metrics and, in a cluster, the
// membership (package peers).
//
// cmd/kylix's serve is flags and output around Config, New and Run; the
// other commands reach a running node through the admin socket (Dial), or,
// for the store commands a node runs on their behalf, get the *Node
// explicitly (Config.Exec). Nothing here is package-level state, so a test
// runs a node in-process (node_test.go).
//
// Where a new node service goes: a file (or a subpackage) of its own here,
// started in New or Run, stopped through Close (onClose), reported in
// Status, and, if the CLI needs it, an op in adminproto.go with its request
// and reply types (docs/design/overview.md).
package node

// Package peers makes several Kylix nodes one store (docs/design/peers.md):
// membership by gossip (hashicorp/serf, encrypted with a key derived from
// the cluster key), a data plane between members (mutual TLS 1.3 with
// certificates derived from the same key) that serves chunks and manifests,
// a Fetcher that brings the chunks a node lacks from the members that hold
// them and verifies each against its id, and the spreading of namespace
// heads so that a file imported on one node appears on all of them.
//
// peers depends on chunkstore only; the CLI wires it into kylix serve.
package peers

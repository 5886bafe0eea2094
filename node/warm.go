package node

import (
	"context"
	"fmt"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/peers"
)

// WarmReply is what kylix warm reports.
type WarmReply struct {
	Path          string  `json:"path"`
	Files         int     `json:"files"`
	Bytes         int64   `json:"bytes"`
	Seconds       float64 `json:"seconds"`
	GBps          float64 `json:"gb_per_s"`
	ResidentBytes int64   `json:"resident_bytes"`
	Verified      bool    `json:"verified"`
	// LocalBytes were read from this node's packs; FetchedBytes (of
	// FetchedChunks distinct chunks) were not stored here and came from
	// the cluster through the node's fetcher (peer cache, relay or
	// holders).
	LocalBytes    int64 `json:"local_bytes"`
	FetchedBytes  int64 `json:"fetched_bytes"`
	FetchedChunks int   `json:"fetched_chunks"`
	// PeerCachedBytes of FetchedBytes were in this node's peer cache
	// already when the warm began (the rest came over the network).
	PeerCachedBytes int64 `json:"peer_cached_bytes"`
}

// Warm reads every chunk of the namespace path path, verified, so that the
// packs are in the page cache (kylix warm, with or without a node;
// chunkstore.Store.Warm). With member (a cluster member) the chunks not
// stored here are fetched from the members into its peer cache, and the
// reply says how much of them was there already. Progress goes to
// progress.
func Warm(ctx context.Context, s *chunkstore.Store, member *peers.Node, path string, progress Progress) (WarmReply, error) {
	clean, err := chunkstore.CleanPath(path)
	if err != nil {
		return WarmReply{}, fmt.Errorf("warm %s: %w", path, err)
	}
	label := "warm " + ShownPath(clean)
	var cachedBefore int64
	opts := chunkstore.WarmOptions{Progress: func(p chunkstore.WarmProgress) {
		l := label
		if p.Fetched > 0 {
			l = fmt.Sprintf("%s (%s local, %s fetched)", label, human(p.Done-p.Fetched), human(p.Fetched))
		}
		progress.report(l, p.Done, p.Total)
	}}
	if member != nil {
		opts.Fetching = func(refs []chunkstore.ChunkRef) { _, cachedBefore = member.PeerCached(refs) }
	}
	res, err := s.Warm(ctx, clean, opts)
	if err != nil {
		return WarmReply{}, fmt.Errorf("warm %s: %w", ShownPath(clean), err)
	}
	out := WarmReply{Path: ShownPath(clean), Files: len(res.Files), Bytes: res.Bytes, Seconds: res.Duration.Seconds(), Verified: true,
		LocalBytes: res.LocalBytes, FetchedBytes: res.FetchedBytes, FetchedChunks: res.FetchedChunks, PeerCachedBytes: cachedBefore}
	if res.Duration > 0 {
		out.GBps = float64(res.LocalBytes+res.FetchedBytes) / res.Duration.Seconds() / 1e9
	}
	for _, f := range res.Files {
		out.ResidentBytes += FileResident(f)
	}
	return out, nil
}

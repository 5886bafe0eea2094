package chunkstore

import (
	"context"
	"errors"
	"os"
	"sort"
	"time"

	"github.com/kylix/kylix/internal/pace"
)

// DefaultScrubRate is the scrub's default read rate in bytes per second:
// low enough to leave a disk and a core to the readers (hashing runs at
// over 1 GB/s per core), high enough to re-check 200 GiB of models every
// hour.
const DefaultScrubRate = 64 << 20

// scrubPause is the wait between scrub passes, so a node with a few
// small packs does not re-read them without pause.
const scrubPause = time.Minute

// ScrubReport is the result of one scrub pass.
type ScrubReport struct {
	Packs int   `json:"packs"`
	Bytes int64 `json:"bytes"`
	Bad   []*PackCheck
}

// ScrubPacks re-hashes, once, every pack that passed its check in this
// run (the packs handed out for passthrough), reading at most rate bytes
// per second (0: as fast as the disk goes). A pack that fails is recorded
// as bad: later opens of its file are served by the node. Passthrough
// descriptors already handed out cannot be revoked (the kernel reads the
// pack directly), so the failure is logged as one line saying so.
func (s *Store) ScrubPacks(ctx context.Context, rate int64) (ScrubReport, error) {
	var rep ScrubReport
	v := &s.pverify
	v.mu.Lock()
	s.loadChecksLocked()
	keys := make([]packFileKey, 0, len(v.recs))
	for k, c := range v.recs {
		if c.OK() {
			keys = append(keys, k)
		}
	}
	v.mu.Unlock()
	sort.Slice(keys, func(i, j int) bool { return keys[i].pack < keys[j].pack })
	pacer := pace.New(rate)
	pace := func(n int64) error {
		v.scrubBytes.Add(n)
		return pacer.Wait(ctx, n)
	}
	for _, k := range keys {
		f, err := s.OpenFile(k.file)
		if err != nil {
			s.forget(k) // the file is gone from the store
			continue
		}
		fh, err := os.Open(s.PackPath(k.pack))
		if err != nil {
			s.forget(k)
			continue
		}
		c, err := s.checkPack(ctx, fh, k.pack, f, pace)
		fh.Close()
		if err != nil {
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			if !errors.Is(err, errPackChanged) {
				s.log.Warn("scrub: cannot check pack", "pack", s.PackPath(k.pack), "err", err)
			}
			continue
		}
		rep.Packs++
		rep.Bytes += c.Bytes
		if !c.OK() {
			rep.Bad = append(rep.Bad, c)
			v.scrubFailed.Add(1)
			s.log.Error("scrub: pack failed verification; new opens are served by the node, passthrough opens made before cannot be revoked and read the pack until closed", "err", c.Err())
		}
		s.recordQuiet(k, c)
	}
	v.scrubPasses.Add(1)
	return rep, nil
}

// RunScrub runs scrub passes at rate bytes per second until ctx ends.
// rate 0 disables the scrub.
func (s *Store) RunScrub(ctx context.Context, rate int64) {
	if rate <= 0 {
		return
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := s.ScrubPacks(ctx, rate); err != nil {
			return
		}
		t.Reset(scrubPause)
	}
}

func (s *Store) forget(k packFileKey) {
	v := &s.pverify
	v.mu.Lock()
	old := v.recs[k]
	delete(v.recs, k)
	v.mu.Unlock()
	if old != nil && old.OK() {
		gone := *old
		gone.Bad = []BadChunk{{Err: "the file or its pack is gone"}}
		s.persistCheck(&gone)
	}
}

// recordQuiet records a scrub's result (the scrub logged it itself).
func (s *Store) recordQuiet(k packFileKey, c *PackCheck) {
	v := &s.pverify
	v.mu.Lock()
	old := v.recs[k]
	v.recs[k] = c
	v.mu.Unlock()
	if !c.OK() || old == nil || old.Identity != c.Identity {
		s.persistCheck(c)
	}
}

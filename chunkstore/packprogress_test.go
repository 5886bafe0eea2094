package chunkstore

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// TestWaitingOpenHurriesBackgroundCheck: a pack whose check was started in
// the background at a crawl (1 byte/s) is proven at full speed for an
// opener that waits (OpenPassthrough, the client socket's PACKS): one
// shared check, not a second one.
func TestWaitingOpenHurriesBackgroundCheck(t *testing.T) {
	s := openTest(t, t.TempDir())
	f, _ := importOne(t, s, randBytes(rand.New(rand.NewPCG(7, 8)), InlineCheckMax+1<<20), "big")
	ctx := context.Background()
	if _, err := s.TryOpenPassthrough(ctx, f, 1); !errors.Is(err, ErrPackUnchecked) {
		t.Fatalf("first open of an unchecked large pack: %v, want ErrPackUnchecked", err)
	}
	if st := s.PackVerifyStats(); st.Deferred != 1 || st.Verified != 0 || st.Bytes != 0 {
		t.Fatalf("after the deferred open: %+v", st)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pf, err := s.OpenPassthrough(wctx, f)
	if err != nil {
		t.Fatalf("waiting open: %v", err)
	}
	pf.Close()
	if st := s.PackVerifyStats(); st.Verified != 1 || st.Bytes != f.Size() {
		t.Fatalf("one shared check expected: %+v", st)
	}
	pf, err = s.TryOpenPassthrough(ctx, f, 1)
	if err != nil {
		t.Fatalf("open after the check: %v", err)
	}
	pf.Close()
}

// TestCloseStopsBackgroundCheck: closing the store ends a background
// check that would take a long time (paced at 1 byte/s), records nothing,
// and later opens cannot start one.
func TestCloseStopsBackgroundCheck(t *testing.T) {
	s := openTest(t, t.TempDir())
	f, _ := importOne(t, s, randBytes(rand.New(rand.NewPCG(9, 10)), InlineCheckMax+1<<20), "big")
	if _, err := s.TryOpenPassthrough(context.Background(), f, 1); !errors.Is(err, ErrPackUnchecked) {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waits for a paced background check")
	}
	if st := s.PackVerifyStats(); st.Verified != 0 || st.Failed != 0 {
		t.Fatalf("a cancelled check was recorded: %+v", st)
	}
	s.pverify.mu.Lock()
	n := len(s.pverify.flights)
	s.pverify.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d flights left after Close", n)
	}
}

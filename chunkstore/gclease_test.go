package chunkstore

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/kylix/kylix/chunkstore/storeio"
	"github.com/kylix/kylix/chunkstore/storeio/storeiotest"
)

// TestGCDuringReadInFlight: GC collects a file's pack while a read of it is
// in flight. The read must still return the right bytes (the old code closed
// the fd under it: EBADF, or another file's bytes had the number been
// reused), and the pack goes when the read is done.
func TestGCDuringReadInFlight(t *testing.T) {
	src := t.TempDir()
	want := writeTree(t, src, map[string]int{"a": 3 << 20}, 11)["a"]
	s := openTest(t, t.TempDir())
	ctx := context.Background()
	if _, err := s.Import(ctx, src, "m", ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	f, _, err := s.OpenPath("m/a")
	if err != nil {
		t.Fatal(err)
	}
	pack := f.Extents()[0].PackPath
	fr := storeiotest.Wrap(s.io)
	entered, proceed := make(chan struct{}), make(chan struct{})
	first := true
	fr.Before = func([]*storeio.Request) {
		if first {
			first = false
			close(entered)
			<-proceed
		}
	}
	s.io = fr
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	got := make([]byte, len(want))
	go func() {
		n, err := f.ReadAt(got, 0)
		done <- result{n, err}
	}()
	<-entered
	if err := s.Update(func(tx *NSTx) error { return tx.Remove("m", true) }); err != nil {
		t.Fatal(err)
	}
	res, err := s.GC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.PacksRemoved != 1 {
		t.Fatalf("gc: %+v", res)
	}
	if _, err := os.Stat(pack); err != nil {
		t.Fatalf("GC deleted a pack a read still uses: %v", err)
	}
	close(proceed)
	select {
	case r := <-done:
		if r.err != nil || r.n != len(want) || !bytes.Equal(got, want) {
			t.Fatalf("read during GC: %d bytes, %v (equal %v)", r.n, r.err, bytes.Equal(got, want))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("read did not finish")
	}
	if _, err := os.Stat(pack); !os.IsNotExist(err) {
		t.Fatalf("pack still there after its last read: %v", err)
	}
}

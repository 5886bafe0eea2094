package fs

import (
	"testing"
)

// BenchmarkAdmit measures what space accounting adds to each write
// through the mount: admit (one statfs) and done (one fstat).
func BenchmarkAdmit(b *testing.B) {
	dir := b.TempDir()
	f := &FS{opts: Options{TempDir: dir}, space: &space{dir: dir, reserve: Reserve{Percent: 5}, low: DefaultLowSpace, root: true}}
	tf, err := f.newTemp()
	if err != nil {
		b.Fatal(err)
	}
	defer tf.release()
	for b.Loop() {
		if err := f.space.admit(tf, 4096, true); err != nil {
			b.Fatal(err)
		}
		f.space.done(tf, 4096)
	}
}

func TestAdmitAccounting(t *testing.T) {
	dir := t.TempDir()
	sp := &space{dir: dir, reserve: Reserve{Percent: 5}, low: DefaultLowSpace, root: true}
	f := &FS{opts: Options{TempDir: dir}, space: sp}
	tf, err := f.newTemp()
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.admit(tf, 1<<20, true); err != nil {
		t.Fatal(err)
	}
	if sp.inflight != 1<<20 || sp.pending != commitNeed(1<<20) || tf.res != sp.pending {
		t.Fatalf("after admit: inflight %d pending %d res %d", sp.inflight, sp.pending, tf.res)
	}
	if _, err := tf.f.WriteAt(make([]byte, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	sp.done(tf, 1<<20)
	if sp.inflight != 0 || tf.alloc < 1<<20 || sp.pending != commitNeed(tf.alloc) {
		t.Fatalf("after done: inflight %d pending %d alloc %d", sp.inflight, sp.pending, tf.alloc)
	}
	st, err := sp.stat()
	if err != nil {
		t.Fatal(err)
	}
	// More than the free space is refused and changes nothing.
	if err := sp.admit(tf, st.free, true); err == nil {
		t.Fatal("admitted more than the free space")
	}
	if sp.inflight != 0 || sp.pending != commitNeed(tf.alloc) {
		t.Fatalf("a refused admit changed the account: inflight %d pending %d", sp.inflight, sp.pending)
	}
	tf.release()
	if sp.pending != 0 {
		t.Fatalf("pending %d after the working copy was freed", sp.pending)
	}
}

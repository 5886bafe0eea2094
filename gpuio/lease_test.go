package gpuio

import (
	"bytes"
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/chunkstore/storeio"
	"github.com/kylix/kylix/chunkstore/storeio/storeiotest"
)

// TestGCWaitsForLoad: GC runs while a load reads a pack. The load holds a
// lease on it (chunkstore.Plan), so the pack stays until the load ends and
// goes after (the old code deleted it under the load).
func TestGCWaitsForLoad(t *testing.T) {
	fx := newFixture(t)
	f := fx.open(t, "opaque.bin")
	pack := f.Extents()[0].PackPath
	fr := storeiotest.Wrap(storeio.NewPread(4))
	defer fr.Close()
	entered, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	fr.Before = func([]*storeio.Request) { once.Do(func() { close(entered); <-proceed }) }
	dev := &HostDevice{}
	l, err := New(fx.st, dev, Options{IO: IOBuffered, Reader: fr, Buffers: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	mem, _ := dev.Alloc(f.Size())
	defer mem.Free()
	done := make(chan error, 1)
	go func() {
		_, err := l.ReadRange(context.Background(), f, 0, f.Size(), mem, 0)
		done <- err
	}()
	<-entered
	if err := fx.st.Update(func(tx *chunkstore.NSTx) error { return tx.Remove("opaque.bin", false) }); err != nil {
		t.Fatal(err)
	}
	if res, err := fx.st.GC(context.Background()); err != nil || res.PacksRemoved != 1 {
		t.Fatalf("gc: %+v %v", res, err)
	}
	_, statErr := os.Stat(pack)
	close(proceed)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("load during GC: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("load did not finish")
	}
	if statErr != nil {
		t.Fatalf("GC deleted a pack a load was reading: %v", statErr)
	}
	if !bytes.Equal(mem.(HostViewer).HostView()[:f.Size()], fx.files["opaque.bin"]) {
		t.Fatal("load during GC placed wrong bytes")
	}
	if _, err := os.Stat(pack); !os.IsNotExist(err) {
		t.Fatalf("pack still there after the load: %v", err)
	}
}

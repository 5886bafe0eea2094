package gpublake3

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kylix/kylix/cuda"
	"github.com/kylix/kylix/cuda/cudatest"
	"github.com/zeebo/blake3"
)

// layout places messages of the given lengths one after another with
// random gaps, fills everything with random bytes and sets each Want to
// zeebo's hash. Every other message starts 16-byte aligned (the kernel's
// wide-load path); the rest start at a random offset. align > 0 forces
// every offset to a multiple of align.
func layout(rng *rand.Rand, lens []int64, align int64) ([]byte, []Msg) {
	var msgs []Msg
	var off int64
	for i, n := range lens {
		off += rng.Int64N(300)
		if align > 0 {
			off = (off + align - 1) / align * align
		} else if i%2 == 0 {
			off = (off + 15) &^ 15
		}
		msgs = append(msgs, Msg{Off: off, Len: n})
		off += n
	}
	buf := make([]byte, off+rng.Int64N(100)+1)
	for i := 0; i+8 <= len(buf); i += 8 {
		v := rng.Uint64()
		for k := range 8 {
			buf[i+k] = byte(v >> (8 * k))
		}
	}
	for i := range msgs {
		msgs[i].Want = blake3.Sum256(buf[msgs[i].Off : msgs[i].Off+msgs[i].Len])
	}
	return buf, msgs
}

// TestNoGPU: without a GPU every entry point returns an error wrapping
// cuda.ErrUnavailable.
func TestNoGPU(t *testing.T) {
	if cuda.Available() == nil {
		t.Skip("CUDA is available here")
	}
	var (
		h *Hasher
		p *Pending
	)
	_, errNew := New(nil)
	_, errVerify := h.Verify(nil, nil, []Msg{{}})
	_, errWait := p.Wait(context.Background())
	for name, err := range map[string]error{
		"New":          errNew,
		"Verify":       errVerify,
		"Pending.Wait": errWait,
		"Close":        h.Close(),
	} {
		if !errors.Is(err, cuda.ErrUnavailable) {
			t.Errorf("%s: %v, want an error wrapping cuda.ErrUnavailable", name, err)
		}
	}
}

// gpu sets up a context, a Hasher and a stream for a test.
func gpu(tb testing.TB) (*cuda.Context, *Hasher) {
	tb.Helper()
	cudatest.RequireGPU(tb)
	dev, err := cuda.GetDevice(0)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		tb.Fatal(err)
	}
	start := time.Now()
	h, err := New(ctx)
	if err != nil {
		ctx.Close()
		tb.Fatal(err)
	}
	arch, img := h.Arch()
	nv, _ := cuda.NVRTCPath()
	ma, mi, _ := cuda.NVRTCVersion()
	tb.Logf("New: %s as %s in %v (NVRTC %d.%d, %s)", arch, img, time.Since(start).Round(time.Millisecond), ma, mi, nv)
	tb.Cleanup(func() {
		if err := h.Close(); err != nil {
			tb.Errorf("Hasher.Close: %v", err)
		}
		if err := ctx.Close(); err != nil {
			tb.Errorf("Context.Close: %v", err)
		}
	})
	return ctx, h
}

// upload copies b into new device memory (freed at cleanup).
func upload(tb testing.TB, ctx *cuda.Context, b []byte) *cuda.DeviceMem {
	tb.Helper()
	m, err := ctx.Alloc(len(b))
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := m.WriteAt(b, 0); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := m.Free(); err != nil {
			tb.Errorf("free: %v", err)
		}
	})
	return m
}

func newStream(tb testing.TB, ctx *cuda.Context) *cuda.Stream {
	tb.Helper()
	s, err := ctx.NewStream()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("stream close: %v", err)
		}
	})
	return s
}

func verifyWait(tb testing.TB, h *Hasher, s *cuda.Stream, buf *cuda.DeviceMem, msgs []Msg) ([]int, [][32]byte) {
	tb.Helper()
	p, err := h.Verify(s, buf, msgs)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bad, err := p.Wait(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	return bad, p.Sums()
}

var testLens = []int64{0, 1, 63, 64, 65, 1023, 1024, 1025, 2048, 3073, 4 << 20, 4<<20 + 1, 16 << 20}

func TestVerifyMatchesZeebo(t *testing.T) {
	ctx, h := gpu(t)
	s := newStream(t, ctx)
	rng := rand.New(rand.NewPCG(7, 8))
	for _, align := range []int64{0, 1, 4} {
		buf, msgs := layout(rng, testLens, align)
		dbuf := upload(t, ctx, buf)
		bad, sums := verifyWait(t, h, s, dbuf, msgs)
		if len(bad) != 0 {
			t.Errorf("align %d: mismatches %v", align, bad)
		}
		for i, m := range msgs {
			if sums[i] != m.Want {
				t.Errorf("align %d: message %d (%d bytes at %d): GPU %x, zeebo %x", align, i, m.Len, m.Off, sums[i], m.Want)
			}
		}
	}
	// Every length from 0 to 3 KiB+, and around every power-of-two chunk
	// count up to 64 chunks, in one call.
	var lens []int64
	for n := int64(0); n <= 3200; n += 7 {
		lens = append(lens, n)
	}
	for c := int64(1); c <= 64; c++ {
		lens = append(lens, c*1024-1, c*1024, c*1024+1)
	}
	buf, msgs := layout(rng, lens, 0)
	dbuf := upload(t, ctx, buf)
	bad, sums := verifyWait(t, h, s, dbuf, msgs)
	if len(bad) != 0 {
		t.Errorf("sweep: %d mismatches, first %v", len(bad), bad[:min(len(bad), 10)])
		for _, i := range bad[:min(len(bad), 5)] {
			t.Logf("message %d: %d bytes at %d: GPU %x zeebo %x", i, msgs[i].Len, msgs[i].Off, sums[i], msgs[i].Want)
		}
	}
}

func TestVerifyCorrupt(t *testing.T) {
	ctx, h := gpu(t)
	s := newStream(t, ctx)
	rng := rand.New(rand.NewPCG(9, 10))
	buf, msgs := layout(rng, testLens, 0)
	dbuf := upload(t, ctx, buf)
	for _, k := range []int{1, 5, 7, 11, 12} { // 1 byte, 1 KiB, 1 KiB+1, 4 MiB+1, 16 MiB
		m := msgs[k]
		pos := m.Off + rng.Int64N(m.Len)
		b := []byte{buf[pos] ^ 0x40}
		if _, err := dbuf.WriteAt(b, pos); err != nil {
			t.Fatal(err)
		}
		bad, _ := verifyWait(t, h, s, dbuf, msgs)
		if !slices.Equal(bad, []int{k}) {
			t.Errorf("byte %d of message %d (%d bytes) flipped: mismatches %v, want [%d]", pos-m.Off, k, m.Len, bad, k)
		}
		if _, err := dbuf.WriteAt(buf[pos:pos+1], pos); err != nil {
			t.Fatal(err)
		}
	}
	// A wrong expectation is reported too, and only for that message.
	msgs[0].Want[31] ^= 1
	bad, _ := verifyWait(t, h, s, dbuf, msgs)
	if !slices.Equal(bad, []int{0}) {
		t.Errorf("wrong Want for message 0: mismatches %v", bad)
	}
	// Out of range.
	_, err := h.Verify(s, dbuf, []Msg{{Off: int64(len(buf)) - 10, Len: 11}})
	if !errors.Is(err, cuda.ErrRange) {
		t.Errorf("out of range: %v, want ErrRange", err)
	}
	_, err = h.Verify(s, dbuf, []Msg{{Len: MaxMsgLen + 1}})
	if !errors.Is(err, cuda.ErrRange) {
		t.Errorf("over MaxMsgLen: %v, want ErrRange", err)
	}
}

// TestVerifyConcurrent: many goroutines, each with its own stream and
// several calls in flight, over shared data.
func TestVerifyConcurrent(t *testing.T) {
	ctx, h := gpu(t)
	rng := rand.New(rand.NewPCG(11, 12))
	var lens []int64
	for range 48 {
		lens = append(lens, []int64{4 << 20, 1 << 20, rng.Int64N(4 << 20), rng.Int64N(3000)}[rng.IntN(4)])
	}
	buf, msgs := layout(rng, lens, 0)
	dbuf := upload(t, ctx, buf)
	const workers, calls, depth = 8, 12, 3
	var wg sync.WaitGroup
	errs := make(chan error, workers*calls)
	for w := range workers {
		s := newStream(t, ctx)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 99))
			type call struct {
				p       *Pending
				corrupt int
			}
			var q []call
			finish := func(c call) {
				bad, err := c.p.Wait(context.Background())
				want := []int(nil)
				if c.corrupt >= 0 {
					want = []int{c.corrupt}
				}
				if err != nil {
					errs <- err
				} else if !slices.Equal(bad, want) {
					errs <- fmt.Errorf("worker %d: mismatches %v, want %v", w, bad, want)
				}
			}
			for range calls {
				// A random subset of the messages, one with a wrong Want.
				lo := r.IntN(len(msgs))
				hi := lo + 1 + r.IntN(len(msgs)-lo)
				sub := slices.Clone(msgs[lo:hi])
				c := call{corrupt: -1}
				if r.IntN(2) == 0 {
					c.corrupt = r.IntN(len(sub))
					sub[c.corrupt].Want[r.IntN(32)] ^= 0x80
				}
				p, err := h.Verify(s, dbuf, sub)
				if err != nil {
					errs <- err
					return
				}
				c.p = p
				q = append(q, c)
				if len(q) == depth {
					finish(q[0])
					q = q[1:]
				}
			}
			for _, c := range q {
				finish(c)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := dbuf.Busy(); n != 0 {
		t.Errorf("buffer still held by %d launches after every Wait", n)
	}
}

// TestThroughput hashes 8 GiB (2048 messages of 4 MiB, 128 calls of 64 MiB
// over a 1 GiB buffer, 8 streams) and reports the rate.
func TestThroughput(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	ctx, h := gpu(t)
	const (
		msgLen   = 4 << 20
		perCall  = 16 // 64 MiB per call
		bufLen   = 1 << 30
		total    = 8 << 30
		nStreams = 8
	)
	rng := rand.New(rand.NewPCG(13, 14))
	pattern := make([]byte, perCall*msgLen)
	for i := range pattern {
		pattern[i] = byte(rng.Uint32())
	}
	var wants [perCall][32]byte
	for i := range wants {
		wants[i] = blake3.Sum256(pattern[i*msgLen : (i+1)*msgLen])
	}
	dbuf, err := ctx.Alloc(bufLen)
	if err != nil {
		t.Fatal(err)
	}
	defer dbuf.Free()
	for off := 0; off < bufLen; off += len(pattern) {
		if _, err := dbuf.WriteAt(pattern, int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	streams := make([]*cuda.Stream, nStreams)
	for i := range streams {
		streams[i] = newStream(t, ctx)
	}
	calls := total / len(pattern)
	run := func() time.Duration {
		start := time.Now()
		var ps []*Pending
		wait := func(p *Pending) {
			bad, err := p.Wait(context.Background())
			if err != nil || len(bad) != 0 {
				t.Fatalf("bad %v, err %v", bad, err)
			}
		}
		for c := range calls {
			base := int64(c*len(pattern)) % bufLen
			msgs := make([]Msg, perCall)
			for i := range msgs {
				msgs[i] = Msg{Off: base + int64(i*msgLen), Len: msgLen, Want: wants[i]}
			}
			p, err := h.Verify(streams[c%nStreams], dbuf, msgs)
			if err != nil {
				t.Fatal(err)
			}
			ps = append(ps, p)
			if len(ps) == 2*nStreams { // two calls in flight per stream
				wait(ps[0])
				ps = ps[1:]
			}
		}
		for _, p := range ps {
			wait(p)
		}
		return time.Since(start)
	}
	run() // warm up: scratch pool, module
	for range 2 {
		d := run()
		t.Logf("8 GiB as %d calls of 16 x 4 MiB on %d streams, 2 in flight each: %v, %.1f GB/s", calls, nStreams, d.Round(time.Microsecond), float64(total)/d.Seconds()/1e9)
	}

	// GPU time of one 64 MiB call, from events around it on one stream.
	s := streams[0]
	ev0, _ := ctx.NewEvent(cuda.EventDefault)
	ev1, _ := ctx.NewEvent(cuda.EventDefault)
	defer ev0.Destroy()
	defer ev1.Destroy()
	msgs := make([]Msg, perCall)
	for i := range msgs {
		msgs[i] = Msg{Off: int64(i * msgLen), Len: msgLen, Want: wants[i]}
	}
	for range 3 {
		ev0.Record(s)
		p, err := h.Verify(s, dbuf, msgs)
		if err != nil {
			t.Fatal(err)
		}
		ev1.Record(s)
		if _, err := p.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		ev1.Synchronize()
		d, err := cuda.ElapsedTime(ev0, ev1)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("one call, 64 MiB (16 x 4 MiB): GPU time %v, %.1f GB/s", d, float64(len(pattern))/d.Seconds()/1e9)
	}
}

// BenchmarkVerify: 64 MiB of 4 MiB messages per call, one stream, one call
// in flight (latency-bound: includes the upload, two launches, the
// download and the completion hand-off).
func BenchmarkVerify(b *testing.B) {
	ctx, h := gpu(b)
	s := newStream(b, ctx)
	rng := rand.New(rand.NewPCG(15, 16))
	lens := make([]int64, 16)
	for i := range lens {
		lens[i] = 4 << 20
	}
	buf, msgs := layout(rng, lens, 4096)
	dbuf := upload(b, ctx, buf)
	var n int64
	for _, m := range msgs {
		n += m.Len
	}
	b.SetBytes(n)
	b.ResetTimer()
	for range b.N {
		bad, _ := verifyWait(b, h, s, dbuf, msgs)
		if len(bad) != 0 {
			b.Fatal(bad)
		}
	}
}

// BenchmarkVerify4InFlight: as BenchmarkVerify with 4 calls in flight on 4
// streams.
func BenchmarkVerify4InFlight(b *testing.B) {
	ctx, h := gpu(b)
	rng := rand.New(rand.NewPCG(17, 18))
	lens := make([]int64, 16)
	for i := range lens {
		lens[i] = 4 << 20
	}
	buf, msgs := layout(rng, lens, 4096)
	dbuf := upload(b, ctx, buf)
	var ss []*cuda.Stream
	for range 4 {
		ss = append(ss, newStream(b, ctx))
	}
	b.SetBytes(64 << 20)
	b.ResetTimer()
	var q []*Pending
	for i := range b.N {
		p, err := h.Verify(ss[i%4], dbuf, msgs)
		if err != nil {
			b.Fatal(err)
		}
		q = append(q, p)
		if len(q) == 4 {
			if bad, err := q[0].Wait(context.Background()); err != nil || len(bad) != 0 {
				b.Fatal(bad, err)
			}
			q = q[1:]
		}
	}
	for _, p := range q {
		if bad, err := p.Wait(context.Background()); err != nil || len(bad) != 0 {
			b.Fatal(bad, err)
		}
	}
}

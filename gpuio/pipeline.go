package gpuio

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/chunkstore/storeio"
)

// job is one group read plus where its bytes go.
type job struct {
	g     group
	place placer
	// into, on the unified path, is the device memory (as the CPU sees it)
	// that the group's chunks go to whole: they are read straight there.
	into []byte
	// shared, when set and true at the read, says others read the same
	// bytes now (ReadOptions.Shared): an IOAuto read of bytes not in the
	// page cache goes through it too.
	shared func() bool
	// verifyEveryLoad: hash the group's chunks even when they come from
	// pinned pages verified when pinned (ReadOptions.VerifyEveryLoad).
	verifyEveryLoad bool
}

// placer issues the copies of the wanted part of a group. src addresses the
// group's bytes: file offset fo is at src offset fo-base.
type placer func(c copier, base int64, g group) ([]Transfer, int64, error)

// copier copies from a group's source buffer (pinned host memory, or device
// staging memory on the gds paths) into device memory.
type copier interface {
	copy1D(dst DeviceMem, dstOff int64, srcOff int64, n int) (Transfer, error)
	copy2D(dst DeviceMem, dstOff int64, dstPitch int, srcOff int64, srcPitch, width, rows int) ([]Transfer, error)
}

type hostCopier struct {
	s   Stream
	buf PinnedMem
}

func (c hostCopier) copy1D(dst DeviceMem, dstOff, srcOff int64, n int) (Transfer, error) {
	return c.s.CopyHtoD(dst, dstOff, c.buf, int(srcOff), n)
}

func (c hostCopier) copy2D(dst DeviceMem, dstOff int64, dstPitch int, srcOff int64, srcPitch, width, rows int) ([]Transfer, error) {
	t, err := c.s.Copy2DHtoD(dst, dstOff, dstPitch, c.buf, int(srcOff), srcPitch, width, rows)
	if err != nil {
		return nil, err
	}
	return []Transfer{t}, nil
}

type devCopier struct {
	s     Stream
	stage DeviceMem
}

func (c devCopier) copy1D(dst DeviceMem, dstOff, srcOff int64, n int) (Transfer, error) {
	return c.s.CopyDtoD(dst, dstOff, c.stage, srcOff, n)
}

func (c devCopier) copy2D(dst DeviceMem, dstOff int64, dstPitch int, srcOff int64, srcPitch, width, rows int) ([]Transfer, error) {
	t, err := c.s.Copy2DDtoD(dst, dstOff, dstPitch, c.stage, srcOff, srcPitch, width, rows)
	if err != nil {
		return nil, err
	}
	return []Transfer{t}, nil
}

// linear places file range [start, start+len) of the group's wanted part at
// dst+dstOff+(fo-start) for each byte fo.
func linear(dst DeviceMem, dstOff, start int64) placer {
	return func(c copier, base int64, g group) ([]Transfer, int64, error) {
		n := g.copyEnd - g.copyStart
		if n <= 0 {
			return nil, 0, nil
		}
		t, err := c.copy1D(dst, dstOff+(g.copyStart-start), g.copyStart-base, int(n))
		if err != nil {
			return nil, 0, err
		}
		return []Transfer{t}, n, nil
	}
}

// strided places a share of a tensor that starts at file offset tstart: outer
// rows of pitch bytes, of which bytes [colOff, colOff+width) of each row are
// wanted, packed densely at dst+dstOff.
func strided(dst DeviceMem, dstOff, tstart int64, pitch, colOff, width int64) placer {
	return func(c copier, base int64, g group) ([]Transfer, int64, error) {
		lo, hi := g.copyStart, g.copyEnd // within the tensor, clipped to the group
		if lo >= hi {
			return nil, 0, nil
		}
		var ts []Transfer
		var placed int64
		firstRow := (lo - tstart) / pitch
		lastRow := (hi - 1 - tstart) / pitch
		// Rows whose wanted segment lies wholly inside [lo, hi) go in one
		// 2D copy; the (at most two) cut rows at the edges go one by one.
		full0, full1 := int64(-1), int64(-1)
		edges := []int64{firstRow, lastRow}
		if firstRow == lastRow {
			edges = edges[:1]
		}
		for _, r := range edges {
			s := tstart + r*pitch + colOff
			a, b := max(s, lo), min(s+width, hi)
			if a >= b || (a == s && b == s+width) {
				continue
			}
			t, err := c.copy1D(dst, dstOff+r*width+(a-s), a-base, int(b-a))
			if err != nil {
				return ts, placed, err
			}
			ts = append(ts, t)
			placed += b - a
		}
		for r := firstRow; r <= lastRow; r++ {
			s := tstart + r*pitch + colOff
			if s >= lo && s+width <= hi {
				if full0 < 0 {
					full0 = r
				}
				full1 = r
			}
		}
		if full0 >= 0 {
			rows := full1 - full0 + 1
			s := tstart + full0*pitch + colOff
			t2, err := c.copy2D(dst, dstOff+full0*width, int(width), s-base, int(pitch), int(width), int(rows))
			ts = append(ts, t2...)
			if err != nil {
				return ts, placed, err
			}
			placed += rows * width
		}
		return ts, placed, nil
	}
}

// run executes jobs with up to Buffers in flight and fills res.
func (l *Loader) run(ctx context.Context, jobs []job, res *Result) error {
	start := time.Now()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		wg           sync.WaitGroup
		mu           sync.Mutex
		placed, read int64
		kinds        [nIOKinds]int
		atPin        int // groups verified when pinned, not hashed again
		fetched      int64
		fetchedN     int
	)
	res.Path, res.Note, res.Verified = l.path, l.note, !l.opts.NoVerify
	if res.Verified {
		res.VerifyOn = "cpu"
		if l.verifier != nil {
			res.VerifyOn = "device"
		}
	}
loop:
	for _, j := range jobs {
		var buf PinnedMem
		select {
		case buf = <-l.free:
		case <-ctx.Done():
			break loop
		}
		s := <-l.streams
		var stage DeviceMem
		if l.stage != nil {
			stage = <-l.stage
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, kind, err := l.doJob(ctx, j, buf, s, stage)
			// The job waited for its copies: the buffers are free again.
			l.free <- buf
			l.streams <- s
			if stage != nil {
				l.stage <- stage
			}
			if err != nil {
				cancel(err)
				return
			}
			mu.Lock()
			placed += p
			read += j.g.readLen
			kinds[kind]++
			if kind == ioPinnedAtPin {
				atPin++
			}
			if kind == ioFetched {
				fetched += j.g.dataLen
				fetchedN += len(j.g.chunks)
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.Bytes, res.Read, res.Duration = placed, read, time.Since(start)
	res.Fetched, res.FetchedChunks = fetched, fetchedN
	var used []string
	for k, n := range kinds {
		if n > 0 {
			used = append(used, ioKindNames[k])
		}
	}
	res.IO = strings.Join(used, " + ")
	switch {
	case !res.Verified || atPin == 0:
	case atPin == len(jobs):
		res.VerifyOn = "pin"
	default:
		res.VerifyOn += " + pin"
	}
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return nil
}

// ioKind is how one group was read.
type ioKind int

const (
	ioBuffered    ioKind = iota // page cache, copied into a pinned buffer
	ioDirect                    // O_DIRECT into a pinned buffer
	ioMapped                    // straight from the registered page cache
	ioCuFile                    // cuFile into device staging memory
	ioUnified                   // straight into unified memory
	ioPinned                    // straight from a node's pinned, registered pages
	ioPinnedAtPin               // the same, chunks verified when pinned: not hashed again
	ioFetched                   // not stored here: fetched from the members (verified on arrival)
	nIOKinds
)

var ioKindNames = [nIOKinds]string{"page cache", "O_DIRECT", "page cache (mapped)", "cufile", "unified", "page cache (pinned)", "page cache (pinned, verified)", "fetched"}

// source is where a group's bytes are once read: host memory (a pinned
// buffer, or the registered page cache) or device staging memory (cuFile).
type source struct {
	host    []byte    // CPU view of the bytes, nil for cuFile
	pinned  PinnedMem // what the device copies from (host sources)
	hostOff int64     // offset of the group's first data byte in pinned
	onDev   bool      // bytes are in stage already (cuFile)
	devOff  int64     // offset of the first data byte in stage
	kind    ioKind
	done    func() // called once the group's copies completed (pinned sources)
	// verified: pinned pages whose chunks were hashed when pinned
	// (PinnedRange.verified).
	verified bool
	// fd: the pack descriptor a page cache or O_DIRECT read went through
	// (counted: its verified chunks are reported to the store's record of
	// the pack's check, chunkstore.File.NoteVerifiedPieces).
	fd      int
	counted bool
}

// doJob reads, verifies and places one group. It returns only when every copy
// it issued has completed, so its buffers can be reused.
func (l *Loader) doJob(ctx context.Context, j job, buf PinnedMem, s Stream, stage DeviceMem) (int64, ioKind, error) {
	g := j.g
	if err := ctx.Err(); err != nil {
		return 0, ioBuffered, err
	}
	var gen uint64 // before any read: see chunkstore.File.VerifiedReadGen
	if g.from != nil {
		gen = g.from.VerifiedReadGen()
	}
	if j.into != nil {
		if g.pack == 0 {
			return l.fetchInto(ctx, g, j.into)
		}
		return l.readInto(ctx, g, j.into, gen)
	}
	src, err := l.read(ctx, j, buf, stage)
	if err != nil {
		return 0, src.kind, err
	}
	if src.done != nil {
		defer src.done() // after the waits below
	}
	// Pinned pages whose chunks were hashed when pinned are placed as
	// they are: straight from the locked pages to their destination, only
	// the bytes wanted (a share's columns, not its rows' chunks).
	atPin := src.kind == ioPinned && src.verified && !j.verifyEveryLoad && !l.opts.NoVerify
	if atPin {
		src.kind = ioPinnedAtPin
	}
	var ts []Transfer
	var vw VerifyWait
	var c copier
	var base int64
	placed, err := func() (int64, error) {
		switch {
		case atPin:
			c, base = hostCopier{s: s, buf: src.pinned}, g.fileOff-src.hostOff
		case l.verifier != nil:
			// Whole chunks to the device, hashed there, then placed with
			// device-to-device copies.
			if !src.onDev {
				t, err := s.CopyHtoD(stage, 0, src.pinned, int(src.hostOff), int(g.dataLen))
				if err != nil {
					return 0, err
				}
				ts = append(ts, t)
				src.devOff = 0
			}
			msgs := make([]VerifyMsg, len(g.chunks))
			for i, ch := range g.chunks {
				msgs[i] = VerifyMsg{Off: src.devOff + ch.PackOff - g.dataOff, Len: ch.Len, Want: ch.ID}
			}
			var err error
			if vw, err = l.verifier.VerifyAsync(s, stage, msgs); err != nil {
				return 0, fmt.Errorf("device verification: %w", err)
			}
			c, base = devCopier{s: s, stage: stage}, g.fileOff-src.devOff
		case src.onDev:
			if !l.opts.NoVerify {
				// cuFile's bytes never passed the CPU and the device
				// cannot hash: bring them back to hash them.
				host := buf.Bytes()[:g.readLen]
				if err := stage.CopyToHost(host[:src.devOff+g.dataLen], 0); err != nil {
					return 0, fmt.Errorf("read back for verification: %w", err)
				}
				if err := verifyHost(g, host[src.devOff:]); err != nil {
					return 0, err
				}
			}
			c, base = devCopier{s: s, stage: stage}, g.fileOff-src.devOff
		default:
			// Fetched chunks were hashed on arrival (the store checks
			// every fetched chunk, or its fetcher does: VerifiedFetcher)
			// and are not hashed again.
			if !l.opts.NoVerify && src.kind != ioFetched {
				if err := verifyHost(g, src.host[src.hostOff:]); err != nil {
					return 0, err
				}
			}
			c, base = hostCopier{s: s, buf: src.pinned}, g.fileOff-src.hostOff
		}
		pts, n, err := j.place(c, base, g)
		ts = append(ts, pts...)
		return n, err
	}()
	// Wait for everything issued, even after an error or cancellation: the
	// buffers must not be reused while the device still reads them.
	var werr error
	for _, t := range ts {
		werr = errors.Join(werr, t.Wait(context.Background()))
	}
	if vw != nil {
		bad, verr := vw.Wait(context.Background())
		werr = errors.Join(werr, verr)
		if len(bad) > 0 && err == nil {
			ch := g.chunks[bad[0]]
			err = &chunkstore.CorruptError{Chunk: ch.ID, Pack: g.pack, PackOff: ch.PackOff,
				Reason: fmt.Sprintf("hash mismatch (%d of %d chunks bad, checked on the device)", len(bad), len(g.chunks))}
		}
	}
	if err = errors.Join(err, werr); err != nil {
		return 0, src.kind, err
	}
	if src.counted && !l.opts.NoVerify && g.from != nil {
		g.from.NoteVerifiedPieces(gen, g.pack, src.fd, g.chunks)
	}
	return placed, src.kind, nil
}

// verifyHost hashes a group's chunks; data starts at the group's first chunk.
func verifyHost(g group, data []byte) error {
	for _, ch := range g.chunks {
		o := ch.PackOff - g.dataOff
		if chunkstore.Sum(data[o:o+ch.Len]) != ch.ID {
			return &chunkstore.CorruptError{Chunk: ch.ID, Pack: g.pack, PackOff: ch.PackOff, Reason: "hash mismatch"}
		}
	}
	return nil
}

// read brings a group's bytes where the device can copy them from.
func (l *Loader) read(ctx context.Context, j job, buf PinnedMem, stage DeviceMem) (source, error) {
	g := j.g
	if g.pack == 0 {
		src := source{host: buf.Bytes()[:g.dataLen], pinned: buf, kind: ioFetched}
		_, _, err := l.fetchInto(ctx, g, src.host)
		return src, err
	}
	if l.path == PathGDS || l.path == PathGDSCompat {
		src := source{onDev: true, devOff: g.dataOff - g.readOff, kind: ioCuFile}
		return src, l.readGDS(g, stage)
	}
	if l.opts.Pinned != nil {
		if src, ok := l.opts.Pinned.source(l, g); ok {
			return src, nil
		}
	}
	pf, err := l.pack(g.pack)
	if err != nil {
		return source{}, err
	}
	if l.opts.IO == IOMapped {
		reg, err := l.registered(pf)
		if err != nil {
			return source{kind: ioMapped}, fmt.Errorf("mapped read of pack %016x: %w", g.pack, err)
		}
		if g.dataOff+g.dataLen > int64(len(pf.mapped)) {
			return source{kind: ioMapped}, fmt.Errorf("pack %016x is %d bytes, chunk data ends at %d: %w", g.pack, len(pf.mapped), g.dataOff+g.dataLen, chunkstore.ErrCorrupt)
		}
		return source{host: pf.mapped, pinned: reg, hostOff: g.dataOff, kind: ioMapped}, nil
	}
	f, kind := pf.buffered, ioBuffered
	if l.opts.IO == IODirect || (l.opts.IO == IOAuto && !l.opts.CacheColdReads && !(j.shared != nil && j.shared()) && !pf.resident(g.readOff, g.readLen)) {
		f, kind = pf.direct, ioDirect
	}
	src := source{host: buf.Bytes()[:g.readLen], pinned: buf, hostOff: g.dataOff - g.readOff, kind: kind, fd: int(f.Fd()), counted: true}
	req := &storeio.Request{Fd: int(f.Fd()), Off: g.readOff, Buf: src.host}
	if err := l.io.Read(ctx, []*storeio.Request{req}); err != nil {
		return src, fmt.Errorf("read pack %016x at %d: %w", g.pack, g.readOff, err)
	}
	if need := g.dataOff + g.dataLen - g.readOff; int64(req.N) < need {
		return src, fmt.Errorf("pack %016x holds %d of %d bytes at %d: %w", g.pack, req.N, need, g.readOff, chunkstore.ErrCorrupt)
	}
	return src, nil
}

func (l *Loader) readGDS(g group, stage DeviceMem) error {
	l.mu.Lock()
	gf, ok := l.gds[g.pack]
	l.mu.Unlock()
	if !ok {
		pf, err := l.pack(g.pack)
		if err != nil {
			return err
		}
		if pf.direct == nil {
			return fmt.Errorf("gds needs O_DIRECT pack files")
		}
		gd := l.dev.(GDSDevice)
		gf, err = gd.OpenGDS(int(pf.direct.Fd()))
		if err != nil {
			return fmt.Errorf("cuFile register pack %016x: %w", g.pack, err)
		}
		l.mu.Lock()
		if old, ok := l.gds[g.pack]; ok {
			gf.Close()
			gf = old
		} else {
			l.gds[g.pack] = gf
		}
		l.mu.Unlock()
	}
	n, err := gf.Read(stage, 0, g.readOff, int(g.readLen))
	if err != nil {
		return fmt.Errorf("cuFile read pack %016x at %d: %w", g.pack, g.readOff, err)
	}
	if int64(n) < g.dataOff+g.dataLen-g.readOff {
		return fmt.Errorf("cuFile read pack %016x at %d: short (%d bytes): %w", g.pack, g.readOff, n, chunkstore.ErrCorrupt)
	}
	return nil
}

// fetchInto brings the chunks of a group of pieces not stored here
// (planGroups) from the members into `into`, back to back, each straight
// into its place when the store's fetcher can (chunkstore.IntoFetcher);
// they are verified on arrival (File.FetchPiecesInto).
func (l *Loader) fetchInto(ctx context.Context, g group, into []byte) (int64, ioKind, error) {
	dsts := make([][]byte, len(g.chunks))
	for i, ch := range g.chunks {
		dsts[i] = into[ch.PackOff : ch.PackOff+ch.Len]
	}
	if err := g.from.FetchPiecesInto(ctx, g.chunks, dsts); err != nil {
		return 0, ioFetched, fmt.Errorf("chunks at file offset %d not stored here: %w", g.fileOff, err)
	}
	return g.dataLen, ioFetched, nil
}

// readInto reads a group's chunks straight into memory the device uses (the
// unified path) and verifies them there.
func (l *Loader) readInto(ctx context.Context, g group, into []byte, gen uint64) (int64, ioKind, error) {
	pf, err := l.pack(g.pack)
	if err != nil {
		return 0, ioUnified, err
	}
	req := &storeio.Request{Fd: int(pf.buffered.Fd()), Off: g.dataOff, Buf: into[:g.dataLen]}
	if err := l.io.Read(ctx, []*storeio.Request{req}); err != nil {
		return 0, ioUnified, fmt.Errorf("read pack %016x at %d: %w", g.pack, g.dataOff, err)
	}
	if int64(req.N) < g.dataLen {
		return 0, ioUnified, fmt.Errorf("pack %016x holds %d of %d bytes at %d: %w", g.pack, req.N, g.dataLen, g.dataOff, chunkstore.ErrCorrupt)
	}
	if !l.opts.NoVerify {
		for _, ch := range g.chunks {
			o := ch.PackOff - g.dataOff
			if chunkstore.Sum(into[o:o+ch.Len]) != ch.ID {
				// Never leave unverified bytes where the device reads.
				clear(into[:g.dataLen])
				return 0, ioUnified, fmt.Errorf("%w", &chunkstore.CorruptError{Chunk: ch.ID, Pack: g.pack, PackOff: ch.PackOff, Reason: "hash mismatch"})
			}
		}
		if g.from != nil {
			g.from.NoteVerifiedPieces(gen, g.pack, int(pf.buffered.Fd()), g.chunks)
		}
	}
	return g.dataLen, ioUnified, nil
}

package storeio

import (
	"context"
	"sync"

	"golang.org/x/sys/unix"
)

// DefaultPreadWorkers is the number of pread goroutines New("pread", 0)
// starts. Chosen from the measurements in docs/design/storeio.md.
const DefaultPreadWorkers = 16

// maxPreadWorkers caps New's depth when it is used as a worker count: each
// worker blocked in pread holds an OS thread.
const maxPreadWorkers = 64

// preadFunc is unix.Pread; tests substitute one that injects short reads and
// EINTR.
type preadFunc func(fd int, p []byte, off int64) (int, error)

func pread(fd int, p []byte, off int64) (int, error) { return unix.Pread(fd, p, off) }

// preadReader is the portable Reader: a fixed pool of goroutines, each doing
// one blocking pread at a time, shared by all callers. The pool bounds the
// number of reads in flight (and of OS threads blocked in the kernel) no
// matter how many goroutines call Read; a call with a single request to
// read runs it itself while fewer than that many such calls do (inline),
// so at most twice the pool's size are in flight.
type preadReader struct {
	pread    preadFunc
	jobs     chan preadJob
	workers  sync.WaitGroup
	fallback error // set by New("auto") when io_uring was unavailable
	// inline holds a token for each read run in its caller's goroutine
	// (a call with one request to read: handing it to a worker and
	// waiting for it costs two goroutine wake-ups, more than a small
	// read itself); as many as there are workers.
	inline chan struct{}

	mu     sync.RWMutex // write-held by Close; read-held while sending jobs
	closed bool
}

type preadJob struct {
	r *Request
	b *batch
}

var _ Reader = (*preadReader)(nil)

// NewPread returns a Reader that runs reads with unix.Pread on a pool of
// workers goroutines (DefaultPreadWorkers when workers <= 0). Name is "pread".
func NewPread(workers int) Reader {
	return newPread(workers, pread)
}

func newPread(workers int, fn preadFunc) *preadReader {
	if workers <= 0 {
		workers = DefaultPreadWorkers
	}
	p := &preadReader{pread: fn, jobs: make(chan preadJob), inline: make(chan struct{}, workers)}
	p.workers.Add(workers)
	for range workers {
		go p.work()
	}
	return p
}

func (p *preadReader) Name() string { return NamePread }

func (p *preadReader) Read(ctx context.Context, reqs []*Request) error {
	if err := resetRequests(reqs); err != nil {
		return err
	}
	if r := onlyIO(reqs); r != nil && p.runInline(ctx, r) {
		return firstError(reqs)
	}
	b := newBatch(ctx)
	p.mu.RLock()
	stop := error(nil)
	if p.closed {
		stop = ErrClosed
	}
	for _, r := range reqs {
		if !needsIO(NamePread, r) {
			continue
		}
		if stop == nil {
			stop = ctx.Err()
		}
		if stop != nil {
			r.Err = readError(NamePread, r, 0, stop)
			continue
		}
		b.add()
		select {
		case p.jobs <- preadJob{r, b}:
		case <-ctx.Done():
			b.finish()
			stop = ctx.Err()
			r.Err = readError(NamePread, r, 0, stop)
		}
	}
	p.mu.RUnlock()
	b.wait()
	return firstError(reqs)
}

// onlyIO returns the one request of reqs that needs a read, or nil when
// none or several do.
func onlyIO(reqs []*Request) *Request {
	var one *Request
	for _, r := range reqs {
		if needsIO(NamePread, r) {
			if one != nil {
				return nil
			}
			one = r
		}
	}
	return one
}

// runInline reads r in the caller's goroutine if an inline token is free
// (false: it is not, and r is left to the workers). Close waits for it as
// for the workers' reads.
func (p *preadReader) runInline(ctx context.Context, r *Request) bool {
	select {
	case p.inline <- struct{}{}:
	default:
		return false
	}
	defer func() { <-p.inline }()
	p.mu.RLock()
	defer p.mu.RUnlock()
	switch {
	case p.closed:
		r.Err = readError(NamePread, r, 0, ErrClosed)
	case ctx.Err() != nil:
		r.Err = readError(NamePread, r, 0, ctx.Err())
	default:
		p.run(r, ctx)
	}
	return true
}

func (p *preadReader) work() {
	defer p.workers.Done()
	for j := range p.jobs {
		p.run(j.r, j.b.ctx)
		j.b.finish()
	}
}

// run reads r to completion: until its buffer is full, end of file (a read of
// 0 bytes) or an error, retrying short reads and EINTR/EAGAIN.
func (p *preadReader) run(r *Request, ctx context.Context) {
	done, tries := 0, 0
	for done < len(r.Buf) {
		if err := ctx.Err(); err != nil {
			r.Err = readError(NamePread, r, done, err)
			break
		}
		n, err := p.pread(r.Fd, r.Buf[done:], r.Off+int64(done))
		if n > 0 {
			done += n
			tries = 0
		}
		if err != nil {
			if retryable(err) && tries < maxRetries {
				tries++
				continue
			}
			r.Err = readError(NamePread, r, done, err)
			break
		}
		if n == 0 {
			break // end of file
		}
	}
	r.N = done
}

// Close stops the workers after the reads in flight; later Reads fail with
// ErrClosed.
func (p *preadReader) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.jobs)
	p.mu.Unlock()
	p.workers.Wait()
	return nil
}

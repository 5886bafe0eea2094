package test

// Issue 18, item 5: shim readers under write load (docs/design/preload.md,
// "Readers under write load"). Writers create small files through the
// mount in a loop while, for a fixed time, (a) plain readers read files
// through the mount and (b) clients do what the LD_PRELOAD shim does at an
// open: STAT and PACKS with the shared flag over the client socket. The
// figures are requests per second of each kind; docs/bench.md records them.
//
//	KYLIX_BENCH=1 go test -ldflags=-checklinkname=0 -run TestShimReadersUnderWriteLoad -v ./test/
//
// KYLIX_BENCH_SECONDS sets each phase's length (default 5).

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/clientproto"
)

func TestShimReadersUnderWriteLoad(t *testing.T) {
	if os.Getenv("KYLIX_BENCH") != "1" {
		t.Skip("benchmark: set KYLIX_BENCH=1")
	}
	requireFUSE(t)
	dur := 5 * time.Second
	if s, err := strconv.Atoi(os.Getenv("KYLIX_BENCH_SECONDS")); err == nil && s > 0 {
		dur = time.Duration(s) * time.Second
	}
	const (
		nFiles   = 64
		fileSize = 16 << 10
		writers  = 2
		readers  = 2
	)
	data, mnt := dirs(t)
	work := t.TempDir()
	var paths []string
	for i := range nFiles {
		name := fmt.Sprintf("f%03d", i)
		if err := os.WriteFile(filepath.Join(work, name), randomBytes(fileSize, uint64(i)), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, filepath.Join(mnt, "r", name))
	}
	mustKylix(t, "/", "import", "--data", data, work, "r")
	_, sock := startClientNode(t, data, mnt)
	if err := os.Mkdir(filepath.Join(mnt, "w"), 0o755); err != nil {
		t.Fatal(err)
	}

	phase := func(name string, read func(c *clientConn, p string) int) {
		shimDeadline.Store(0)
		stop := make(chan struct{})
		var wrote, reads, handed, timedOut atomic.Int64
		var latMu sync.Mutex
		var maxLat time.Duration
		var wg sync.WaitGroup
		for g := range writers {
			wg.Go(func() {
				b := randomBytes(8<<10, uint64(1000+g))
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					b[0], b[1], b[2] = byte(i), byte(i>>8), byte(i>>16) // a new chunk every file
					p := filepath.Join(mnt, "w", fmt.Sprintf("%s-%d-%d", name, g, i))
					if err := os.WriteFile(p, b, 0o644); err != nil {
						t.Errorf("write %s: %v", p, err)
						return
					}
					wrote.Add(1)
				}
			})
		}
		time.Sleep(200 * time.Millisecond) // the write load is running
		start := time.Now()
		deadline := start.Add(dur)
		for g := range readers {
			var c *clientConn
			if name == "shim" {
				c = dialClient(t, sock)
			}
			wg.Go(func() {
				for i := g; time.Now().Before(deadline); i++ {
					t0 := time.Now()
					n := read(c, paths[i%len(paths)])
					if n < 0 {
						timedOut.Add(1)
						return // the connection is out of step now
					}
					if time.Now().After(deadline) {
						return // finished after the phase: not counted
					}
					handed.Add(int64(n))
					reads.Add(1)
					lat := time.Since(t0)
					latMu.Lock()
					maxLat = max(maxLat, lat)
					latMu.Unlock()
				}
			})
		}
		time.Sleep(time.Until(deadline))
		el := time.Since(start)
		close(stop)
		shimDeadline.Store(time.Now().UnixNano()) // shim requests still waiting give up
		wg.Wait()
		// Drain the committer's backlog before the next phase (and the
		// node's stop): fsync returns once this file is committed, and
		// the committer commits in order.
		drain := filepath.Join(mnt, "w", name+"-drain")
		df, err := os.Create(drain)
		if err != nil {
			t.Fatal(err)
		}
		if err := df.Sync(); err != nil {
			t.Fatalf("fsync %s: %v", drain, err)
		}
		df.Close()
		if name == "shim" && reads.Load() > 0 {
			n := time.Duration(reads.Load())
			t.Logf("BENCH shim readers, mean per request: open %v, STAT %v, PACKS %v",
				(time.Duration(shimOpen.Load()) / n).Round(time.Microsecond),
				(time.Duration(shimStat.Load()) / n).Round(time.Microsecond),
				(time.Duration(shimPacks.Load()) / n).Round(time.Microsecond))
		}
		t.Logf("BENCH %s readers: %d requests in %v = %.0f/s (max %v, still waiting at the end: %d; pack fds handed out: %d); writers: %d files = %.0f/s",
			name, reads.Load(), el.Round(time.Millisecond), float64(reads.Load())/el.Seconds(), maxLat.Round(time.Microsecond),
			timedOut.Load(), handed.Load(), wrote.Load(), float64(wrote.Load())/el.Seconds())
	}

	phase("plain", func(_ *clientConn, p string) int {
		b, err := os.ReadFile(p)
		if err != nil || len(b) != fileSize {
			t.Errorf("read %s: %d bytes, %v", p, len(b), err)
		}
		return 0
	})
	phase("shim", func(c *clientConn, p string) int {
		t0 := time.Now()
		f, err := os.Open(p)
		if err != nil {
			t.Errorf("open %s: %v", p, err)
			return 0
		}
		defer f.Close()
		t1 := time.Now()
		r, err := shimReq(c, clientproto.OpStat, nil, f)
		t2 := time.Now()
		defer func() {
			shimOpen.Add(int64(t1.Sub(t0)))
			shimStat.Add(int64(t2.Sub(t1)))
			shimPacks.Add(int64(time.Since(t2)))
		}()
		if err != nil {
			return -1
		}
		r.close()
		if r.status != 0 {
			t.Errorf("STAT %s: %d %s", p, r.status, r.msg)
			return 0
		}
		r, err = shimReq(c, clientproto.OpPacks, clientproto.AppendPacksRequest(nil, clientproto.PacksShared), f)
		if err != nil {
			return -1
		}
		defer r.close()
		if r.status != 0 {
			t.Errorf("PACKS %s: %d %s", p, r.status, r.msg)
		}
		return len(r.fds)
	})
}

// Time the shim readers spent in open, STAT and PACKS.
var shimOpen, shimStat, shimPacks atomic.Int64

// shimDeadline: when set (Unix ns), shimReq gives up waiting at once.
var shimDeadline atomic.Int64

// shimReq is clientConn.req that returns an error instead of failing the
// test when no reply came before the phase ended.
func shimReq(c *clientConn, op uint16, body []byte, f *os.File) (*clientReply, error) {
	c.seq++
	if _, _, err := c.c.WriteMsgUnix(clientproto.Request(op, c.seq, body), unix.UnixRights(int(f.Fd())), nil); err != nil {
		return nil, err
	}
	buf := make([]byte, 1<<16)
	roob := make([]byte, unix.CmsgSpace(4*clientproto.MaxFds))
	var n, oobn int
	var err error
	for {
		c.c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, oobn, _, _, err = c.c.ReadMsgUnix(buf, roob)
		if err == nil {
			break
		}
		if ne, ok := err.(net.Error); !ok || !ne.Timeout() || shimDeadline.Load() != 0 {
			return nil, err
		}
	}
	r := &clientReply{}
	msgs, _ := unix.ParseSocketControlMessage(roob[:oobn])
	for _, m := range msgs {
		got, _ := unix.ParseUnixRights(&m)
		for _, fd := range got {
			r.fds = append(r.fds, os.NewFile(uintptr(fd), "pack"))
		}
	}
	r.h, r.status, r.msg, r.fields, err = clientproto.ParseReply(buf[:n])
	if err != nil {
		return nil, err
	}
	if r.h.Seq != c.seq || r.h.Op != op|clientproto.ReplyBit {
		r.close()
		return nil, fmt.Errorf("reply header %+v for op %d seq %d", r.h, op, c.seq)
	}
	return r, nil
}

package peers

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zeebo/blake3"

	"github.com/kylix/kylix/chunkstore"
)

// Fetch from three peers (issue 9's benchmark), on each data plane, and the
// ceilings with as many connections (3 peers x connsPerPeer): docs/bench.md.

const benchPeers = 3

// BenchmarkFetch3TLS: a reader fetches every chunk of a file that three
// other members hold, through Fetch (verified), 16 chunks in flight, over
// mutual TLS 1.3.
func BenchmarkFetch3TLS(b *testing.B) { benchFetchFrom(b, benchPeers, false) }

// BenchmarkFetch3Plaintext: the same on the plaintext data plane.
func BenchmarkFetch3Plaintext(b *testing.B) { benchFetchFrom(b, benchPeers, true) }

// BenchmarkCeiling3TLSBlake3: the same bytes in 1 MiB pieces from three
// servers over 3 x connsPerPeer TLS 1.3 connections, each piece hashed with
// BLAKE3 by the receiver: the work a fetch cannot skip.
func BenchmarkCeiling3TLSBlake3(b *testing.B) { benchCeiling(b, benchPeers, true) }

// BenchmarkCeiling3TCPBlake3: the same over plain TCP (the plaintext data
// plane's ceiling).
func BenchmarkCeiling3TCPBlake3(b *testing.B) { benchCeiling(b, benchPeers, false) }

func benchFetchFrom(b *testing.B, holders int, plaintext bool) {
	key, _ := NewKey()
	data := randBytes(benchSize())
	src := filepath.Join(b.TempDir(), "src")
	require.NoError(b, os.WriteFile(src, data, 0o644))
	var hs []*testNode
	var first string
	for i := range holders {
		var join []string
		if first != "" {
			join = []string{first}
		}
		h := benchNodeCfg(b, Config{Name: "holder" + string(rune('a'+i)), Key: key, Join: join, Plaintext: plaintext, NoPlacement: true})
		if first == "" {
			first = h.cfg.Listen
		}
		_, err := h.s.Import(context.Background(), src, "f", chunkstore.ImportOptions{})
		require.NoError(b, err)
		hs = append(hs, h)
	}
	reader := benchNodeCfg(b, Config{Name: "reader", Key: key, Join: []string{first}, Plaintext: plaintext, NoPlacement: true})
	for deadline := time.Now().Add(20 * time.Second); len(reader.livePeers()) != holders; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("the members did not see each other")
		}
	}
	f, _, err := hs[0].s.OpenPath("f")
	require.NoError(b, err)
	chunks := f.M.Chunks
	// Warm up: dial every connection (the ceiling dials before its timer).
	var warm sync.WaitGroup
	for _, c := range chunks[:min(len(chunks), 4*holders*connsPerPeer)] {
		warm.Add(1)
		go func() { defer warm.Done(); reader.Fetch(context.Background(), c.ID, c.Len) }()
	}
	warm.Wait()
	b.SetBytes(f.Size())
	cpu := startCPU(b)
	for range b.N {
		var next atomic.Int64
		var wg sync.WaitGroup
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := next.Add(1) - 1; i < int64(len(chunks)); i = next.Add(1) - 1 {
					if _, err := reader.Fetch(context.Background(), chunks[i].ID, chunks[i].Len); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	cpu.report(f.Size())
	b.ReportMetric(float64(len(chunks)), "chunks")
	served := 0
	for _, h := range hs {
		if h.statsFor(h.self).Served.Load() > 0 {
			served++
		}
	}
	b.ReportMetric(float64(served), "peers-served")
}

func benchNodeCfg(b *testing.B, cfg Config) *testNode {
	cfg.Listen, cfg.Capacity = freeAddr(b), 1<<30
	n, err := New(cfg)
	require.NoError(b, err)
	s, err := chunkstore.Open(chunkstore.Options{Dir: b.TempDir(), Fetcher: n})
	require.NoError(b, err)
	b.Cleanup(func() { s.Close() })
	require.NoError(b, n.Start(s, nil))
	b.Cleanup(func() { n.Close() })
	return &testNode{n, s}
}

func benchCeiling(b *testing.B, servers int, useTLS bool) {
	key, _ := NewKey()
	st, ct, err := tlsConfigs(key)
	require.NoError(b, err)
	data := randBytes(benchSize())
	const piece = 1 << 20
	nconn := servers * connsPerPeer
	part := func(p int) []byte { return data[p*len(data)/nconn : (p+1)*len(data)/nconn] }
	var conns []net.Conn
	for range servers {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(b, err)
		b.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				if useTLS {
					c = tls.Server(c, st)
				}
				go func() {
					defer c.Close()
					var n [1]byte
					for {
						if _, err := io.ReadFull(c, n[:]); err != nil {
							return
						}
						if _, err := c.Write(part(int(n[0]))); err != nil {
							return
						}
					}
				}()
			}
		}()
		for range connsPerPeer {
			var c net.Conn
			if useTLS {
				c, err = tls.Dial("tcp", ln.Addr().String(), ct)
			} else {
				c, err = net.Dial("tcp", ln.Addr().String())
			}
			require.NoError(b, err)
			b.Cleanup(func() { c.Close() })
			conns = append(conns, c)
		}
	}
	b.SetBytes(int64(len(data)))
	cpu := startCPU(b)
	defer cpu.report(int64(len(data)))
	for range b.N {
		var wg sync.WaitGroup
		for p, c := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.Write([]byte{byte(p)})
				n := len(part(p))
				buf := make([]byte, piece)
				for n > 0 {
					m := min(n, piece)
					if _, err := io.ReadFull(c, buf[:m]); err != nil {
						b.Error(err)
						return
					}
					blake3.Sum256(buf[:m])
					n -= m
				}
			}()
		}
		wg.Wait()
	}
}

// cpuMeter measures the process's CPU time (user + system, both sides of
// every connection: sender and receiver share this process) over the
// timed loop, reported as core-seconds per GB moved: the cores a GB/s
// costs.
type cpuMeter struct {
	b     *testing.B
	start time.Duration
	prof  *os.File
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// startCPU starts the timer and the CPU meter. With
// KYLIX_PEERS_BENCH_PROFILE=FILE it also writes a CPU profile of the timed
// part only (setup such as importing the data would swamp -cpuprofile);
// each benchmark's last run overwrites FILE.BENCHMARK.
func startCPU(b *testing.B) *cpuMeter {
	m := &cpuMeter{b: b}
	if p := os.Getenv("KYLIX_PEERS_BENCH_PROFILE"); p != "" {
		f, err := os.Create(p + "." + strings.ReplaceAll(b.Name(), "/", "_"))
		require.NoError(b, err)
		require.NoError(b, pprof.StartCPUProfile(f))
		m.prof = f
	}
	b.ResetTimer()
	m.start = cpuTime()
	return m
}

func (m *cpuMeter) report(bytesPerOp int64) {
	m.b.StopTimer()
	used := (cpuTime() - m.start).Seconds()
	if m.prof != nil {
		pprof.StopCPUProfile()
		m.prof.Close()
	}
	m.b.ReportMetric(used/(float64(bytesPerOp)*float64(m.b.N)/1e9), "cores/(GB/s)")
}

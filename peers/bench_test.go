package peers

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zeebo/blake3"

	"github.com/kylix/kylix/chunkstore"
)

// benchSize is the bytes fetched per iteration (KYLIX_PEERS_BENCH_MIB).
func benchSize() int {
	if v, err := strconv.Atoi(os.Getenv("KYLIX_PEERS_BENCH_MIB")); err == nil && v > 0 {
		return v << 20
	}
	return 256 << 20
}

// BenchmarkFetch: one member fetches a file another holds, every chunk
// through Fetch (the data plane, verified), 16 chunks in flight.
func BenchmarkFetch(b *testing.B) {
	key, _ := NewKey()
	holder := benchNode(b, "holder", key, false)
	reader := benchNode(b, "reader", key, true, holder.cfg.Listen)
	for deadline := time.Now().Add(20 * time.Second); len(reader.livePeers()) != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("the two members did not see each other")
		}
	}
	src := filepath.Join(b.TempDir(), "src")
	require.NoError(b, os.WriteFile(src, randBytes(benchSize()), 0o644))
	_, err := holder.s.Import(context.Background(), src, "f", chunkstore.ImportOptions{})
	require.NoError(b, err)
	f, _, err := holder.s.OpenPath("f")
	require.NoError(b, err)
	chunks := f.M.Chunks
	b.SetBytes(f.Size())
	b.ReportMetric(float64(len(chunks)), "chunks")
	b.ResetTimer()
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
}

// BenchmarkTLSBlake3Ceiling: the work a fetch cannot skip, in the same
// process: the same bytes in the same chunk sizes streamed over
// connsPerPeer TLS 1.3 connections (the data plane's certificates), each
// chunk hashed with BLAKE3 by the receiver.
func BenchmarkTLSBlake3Ceiling(b *testing.B) {
	key, _ := NewKey()
	st, ct, err := tlsConfigs(key)
	require.NoError(b, err)
	data := randBytes(benchSize())
	const chunk = 1 << 20 // about the average chunk of random data
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				tc := tls.Server(c, st)
				defer tc.Close()
				var n [8]byte
				for {
					if _, err := io.ReadFull(tc, n[:4]); err != nil {
						return
					}
					part := int(n[0])<<24 | int(n[1])<<16 | int(n[2])<<8 | int(n[3])
					lo := part * len(data) / connsPerPeer
					hi := (part + 1) * len(data) / connsPerPeer
					if _, err := tc.Write(data[lo:hi]); err != nil {
						return
					}
				}
			}()
		}
	}()
	conns := make([]*tls.Conn, connsPerPeer)
	for i := range conns {
		c, err := tls.Dial("tcp", ln.Addr().String(), ct)
		require.NoError(b, err)
		defer c.Close()
		conns[i] = c
	}
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for range b.N {
		var wg sync.WaitGroup
		for p, c := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.Write([]byte{0, 0, 0, byte(p)})
				n := (p+1)*len(data)/connsPerPeer - p*len(data)/connsPerPeer
				buf := make([]byte, chunk)
				for n > 0 {
					m := min(n, chunk)
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

func benchNode(b *testing.B, name string, key Key, reader bool, join ...string) *testNode {
	n, err := New(Config{Name: name, Listen: freeAddr(b), Key: key, Join: join, Capacity: 1 << 30, NoPlacement: reader})
	require.NoError(b, err)
	s, err := chunkstore.Open(chunkstore.Options{Dir: b.TempDir(), Fetcher: n})
	require.NoError(b, err)
	b.Cleanup(func() { s.Close() })
	require.NoError(b, n.Start(s, nil))
	b.Cleanup(func() { n.Close() })
	return &testNode{n, s}
}

// BenchmarkFetchKV: one member gets KV blocks of 2 MiB another keeps, as
// a node's KV get does on a miss (FetchKV: the data plane, each block
// checked against the BLAKE3 it came with), eight in flight as the
// node's eight KV workers ask them. Against BenchmarkTLSBlake3Ceiling.
func BenchmarkFetchKV(b *testing.B) {
	key, _ := NewKey()
	holder := benchNode(b, "holder", key, false)
	reader := benchNode(b, "reader", key, false, holder.cfg.Listen)
	for deadline := time.Now().Add(20 * time.Second); len(reader.livePeers()) != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("the two members did not see each other")
		}
	}
	const block = 2 << 20
	kv := &sumKV{m: map[string]sumBlock{}}
	require.NoError(b, holder.SetKV(kv))
	require.NoError(b, reader.SetKV(&mapKV{m: map[string][]byte{}}))
	data := randBytes(benchSize())
	var keys [][32]byte
	for i := 0; i+block <= len(data); i += block {
		var k [32]byte
		copy(k[:], fmt.Sprintf("bench-kv-%d", i))
		require.NoError(b, kv.PutBlock(0, k, data[i:i+block]))
		keys = append(keys, k)
	}
	b.SetBytes(int64(len(keys) * block))
	b.ReportMetric(float64(len(keys)), "blocks")
	b.ResetTimer()
	for range b.N {
		var next atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for i := next.Add(1) - 1; i < int64(len(keys)); i = next.Add(1) - 1 {
					if _, _, ok := reader.FetchKV(context.Background(), 0, keys[i]); !ok {
						b.Error("a block the holder keeps was a miss")
						return
					}
				}
			})
		}
		wg.Wait()
	}
}

// sumKV is a member's KV store for BenchmarkFetchKV: blocks with their
// BLAKE3 taken at put, as the node's store keeps them (mapKV hashes at
// every get, which a two-core machine would pay on the sender's side).
type sumKV struct {
	mu sync.Mutex
	m  map[string]sumBlock
}

type sumBlock struct {
	b   []byte
	sum chunkstore.ID
}

func (k *sumKV) PutBlock(ns uint32, key [32]byte, b []byte) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.m[kvName(ns, key)] = sumBlock{b, chunkstore.Sum(b)}
	return nil
}

func (k *sumKV) GetBlock(ns uint32, key [32]byte) ([]byte, chunkstore.ID, func(), bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	x, ok := k.m[kvName(ns, key)]
	return x.b, x.sum, func() {}, ok
}

func (k *sumKV) HasBlock(ns uint32, key [32]byte) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.m[kvName(ns, key)]
	return ok
}

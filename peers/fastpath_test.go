package peers

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

// TestFramePool: a frame has room for the header and exactly the payload,
// frames held at once never share memory, a frame given back serves the
// next one of its class, and frames beyond the largest class are not
// pooled.
func TestFramePool(t *testing.T) {
	for _, n := range []int{0, 1, 4095, 4096, 4097, 1 << 20, 1<<20 + 1, 3 << 20} {
		f := getFrame(n)
		require.Len(t, *f, frameHeader+n, "payload of %d bytes", n)
		require.Equal(t, frameHeader+1<<frameClass(n), cap(*f), "payload of %d bytes", n)
		putFrame(f)
	}
	a, b := getFrame(1<<20), getFrame(1<<20)
	(*a)[frameHeader], (*b)[frameHeader] = 1, 2
	require.NotSame(t, &(*a)[0], &(*b)[0], "two frames held at once share memory")
	require.Equal(t, byte(1), (*a)[frameHeader])
	putFrame(a)
	putFrame(b)
	require.Equal(t, -1, frameClass(1<<maxFrameShift+1))
	big := getFrame(1<<maxFrameShift + 1)
	require.Len(t, *big, frameHeader+1<<maxFrameShift+1)
	putFrame(big) // dropped, not pooled: nothing to check but no panic
}

// TestPipelinedChunksFromPacks: many chunk requests in flight at once on one
// connection, answered from the packs through pooled frames, each get their
// own chunk's bytes (run with -race: a frame is not reused while written);
// a request for a wrong length is an error answer, and the connection
// serves on. On both data planes.
func TestPipelinedChunksFromPacks(t *testing.T) {
	t.Run("tls", func(t *testing.T) { testPipelinedChunks(t, false) })
	t.Run("plaintext", func(t *testing.T) { testPipelinedChunks(t, true) })
}

func testPipelinedChunks(t *testing.T, plaintext bool) {
	key, _ := NewKey()
	a, err := startNodeCfg(t, Config{Name: "a", Key: key, Plaintext: plaintext})
	require.NoError(t, err)
	data := randBytes(12<<20 + 12345)
	importBytes(t, a, "f", data)
	f, _, err := a.s.OpenPath("f")
	require.NoError(t, err)
	cc, err := dialPeer(context.Background(), a.DataAddr(), a.sec)
	require.NoError(t, err)
	defer cc.close(net.ErrClosed)
	type want struct {
		c   chunkstore.ChunkRef
		off int
	}
	var ws []want
	off := 0
	for _, c := range f.M.Chunks {
		ws = append(ws, want{c, off})
		off += int(c.Len)
	}
	var wg sync.WaitGroup
	for round := range 3 {
		for _, w := range ws {
			wg.Add(1)
			go func() {
				defer wg.Done()
				op := opChunk
				if round == 1 {
					op = opRelay
				}
				st, got, err := cc.roundTrip(context.Background(), request{op: op, id: w.c.ID, len: w.c.Len}, w.c.Len)
				if err != nil || st != stOK || !bytes.Equal(got, data[w.off:w.off+int(w.c.Len)]) {
					t.Errorf("chunk %s: status %d, %d bytes, %v", w.c.ID.Short(), st, len(got), err)
				}
			}()
		}
	}
	wg.Wait()
	c := f.M.Chunks[0]
	st, msg, err := cc.roundTrip(context.Background(), request{op: opChunk, id: c.ID, len: c.Len - 1}, c.Len-1)
	require.NoError(t, err)
	require.Equal(t, stError, st, "a request for the wrong length: %s", msg)
	st, _, err = cc.roundTrip(context.Background(), request{op: opChunk, id: chunkstore.Sum([]byte("nobody")), len: 6}, 6)
	require.NoError(t, err)
	require.Equal(t, stNotFound, st)
	st, got, err := cc.roundTrip(context.Background(), request{op: opChunk, id: c.ID, len: c.Len}, c.Len)
	require.NoError(t, err)
	require.Equal(t, stOK, st)
	require.Equal(t, data[:c.Len], got)
}

// TestWrongBytesKeepConnection: a member that flips a byte of each chunk
// (the test hook) gets errWrongChunk from roundTrip, which hashed the bytes
// as they came; the connection stays up for the next request, and ask
// counts a bad chunk.
func TestWrongBytesKeepConnection(t *testing.T) {
	key, _ := NewKey()
	bad := mustStart(t, "bad", key, true)
	rd := mustStart(t, "reader", key, false, bad.cfg.Listen)
	eventually(t, "two alive members", func() bool { return len(rd.livePeers()) == 1 })
	data := randBytes(3 << 20)
	importBytes(t, bad, "f", data)
	f, _, err := bad.s.OpenPath("f")
	require.NoError(t, err)
	cc, err := dialPeer(context.Background(), bad.DataAddr(), bad.sec)
	require.NoError(t, err)
	defer cc.close(net.ErrClosed)
	for _, c := range f.M.Chunks {
		_, got, err := cc.roundTrip(context.Background(), request{op: opChunk, id: c.ID, len: c.Len}, c.Len)
		require.ErrorIs(t, err, errWrongChunk)
		require.Nil(t, got)
		require.False(t, cc.dead())
	}
	p := rd.livePeers()[0]
	c := f.M.Chunks[0]
	_, err = rd.ask(context.Background(), p, opChunk, c.ID, c.Len, nil)
	require.Error(t, err)
	require.Equal(t, int64(1), rd.statsFor("bad").BadChunks.Load())
	require.Zero(t, rd.statsFor("bad").Fetched.Load())
}

// TestAnswerFrames: the client's decoder of a chunk answer: the right bytes
// pass with their hash, wrong bytes of the right length are errWrongChunk,
// an answer longer than asked is a protocol error found before the
// payload is read, and a frame cut short is an unexpected EOF.
func TestAnswerFrames(t *testing.T) {
	chunk := randBytes(300 << 10) // more than one hashed piece
	id := chunkstore.Sum(chunk)
	wrong := append([]byte(nil), chunk...)
	wrong[len(wrong)-1] ^= 1
	ok := appendFrame(nil, stOK, 1, chunk)
	for _, tc := range []struct {
		name  string
		wire  []byte
		check func(t *testing.T, st byte, got []byte, err error)
	}{
		{"right bytes", ok, func(t *testing.T, st byte, got []byte, err error) {
			require.NoError(t, err)
			require.Equal(t, stOK, st)
			require.Equal(t, chunk, got)
		}},
		{"wrong bytes", appendFrame(nil, stOK, 1, wrong), func(t *testing.T, st byte, got []byte, err error) {
			require.ErrorIs(t, err, errWrongChunk)
			require.Nil(t, got)
		}},
		{"longer than asked", appendFrame(nil, stOK, 1, append(chunk, 0)), func(t *testing.T, st byte, got []byte, err error) {
			require.ErrorIs(t, err, errProtocol)
		}},
		{"cut short", ok[:len(ok)-1], func(t *testing.T, st byte, got []byte, err error) {
			require.ErrorIs(t, err, io.ErrUnexpectedEOF)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c1, c2 := net.Pipe()
			cc := &clientConn{c: c1, bw: bufio.NewWriter(c1), pending: map[uint32]*call{}}
			go cc.readLoop()
			go func() {
				io.CopyN(io.Discard, c2, frameHeader+36) // the request
				c2.Write(tc.wire)
				c2.Close()
			}()
			st, got, err := cc.roundTrip(context.Background(), request{op: opChunk, id: id, len: uint32(len(chunk))}, uint32(len(chunk)))
			tc.check(t, st, got, err)
			cc.close(errors.New("test done"))
		})
	}
}

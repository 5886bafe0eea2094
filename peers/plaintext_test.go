package peers

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

// TestPlaintextDataPlane: members on the plaintext data plane read each
// other's files (every chunk still checked against its id); a process
// without the key, or with another key, or speaking TLS, is refused.
func TestPlaintextDataPlane(t *testing.T) {
	key, _ := NewKey()
	a, err := startNodeCfg(t, Config{Name: "a", Key: key, Plaintext: true})
	require.NoError(t, err)
	b, err := startNodeCfg(t, Config{Name: "b", Key: key, Plaintext: true, Join: []string{a.cfg.Listen}})
	require.NoError(t, err)
	eventually(t, "two alive members", func() bool { return len(b.livePeers()) == 1 })
	data := randBytes(6<<20 + 17)
	importBytes(t, a, "f", data)
	eventually(t, "f on b", func() bool { _, err := b.s.Lookup("f"); return err == nil })
	got, err := readAll(b, "f")
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, data))
	require.Positive(t, b.statsFor("a").Fetched.Load())

	// The right key over plaintext: a request is answered.
	ok, err := dialPeer(context.Background(), a.DataAddr(), a.sec)
	require.NoError(t, err)
	_, _, err = ok.roundTrip(context.Background(), request{op: opObject}, maxObject)
	require.NoError(t, err)
	ok.close(net.ErrClosed)

	// Another key: the server's proof fails at the client, and the
	// server refuses the client's.
	k2, _ := NewKey()
	other, err := newSecurity(k2, true)
	require.NoError(t, err)
	_, err = dialPeer(context.Background(), a.DataAddr(), other)
	require.ErrorIs(t, err, errPlainRefused)
	c, err := net.Dial("tcp", a.DataAddr())
	require.NoError(t, err)
	defer c.Close()
	// A client that skips checking the server's proof and sends a wrong
	// one of its own gets no answer.
	hello := append([]byte(plainMagic), make([]byte, plainNonce)...)
	_, err = c.Write(hello)
	require.NoError(t, err)
	ans := make([]byte, plainNonce+plainMACLen)
	_, err = c.Read(ans)
	require.NoError(t, err)
	_, err = c.Write(append(make([]byte, plainMACLen), []byte(wireMagic)...))
	require.NoError(t, err)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := c.Read(ans)
	require.Zero(t, n)
	require.Error(t, err)
	require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "the server kept the connection open")

	// A TLS member cannot talk to a plaintext one.
	tlsSec, err := newSecurity(key, false)
	require.NoError(t, err)
	cc, err := dialPeer(context.Background(), a.DataAddr(), tlsSec)
	if err == nil {
		_, _, err = cc.roundTrip(context.Background(), request{op: opObject}, maxObject)
	}
	require.Error(t, err)
}

// TestPlaintextWrongChunk: on the plaintext data plane too, flipped bytes
// from a member never reach a reader: with no other holder the read fails.
func TestPlaintextWrongChunk(t *testing.T) {
	key, _ := NewKey()
	bad, err := startNodeCfg(t, Config{Name: "bad", Key: key, Plaintext: true, CorruptServed: true})
	require.NoError(t, err)
	rd, err := startNodeCfg(t, Config{Name: "reader", Key: key, Plaintext: true, Join: []string{bad.cfg.Listen}})
	require.NoError(t, err)
	eventually(t, "two alive members", func() bool { return len(rd.livePeers()) == 1 })
	importBytes(t, bad, "g", randBytes(1<<20))
	eventually(t, "g on reader", func() bool { _, err := rd.s.Lookup("g"); return err == nil })
	_, err = readAll(rd, "g")
	require.Error(t, err)
	require.True(t, errors.Is(err, chunkstore.ErrNotLocal) || errors.Is(err, chunkstore.ErrCorrupt), "err: %v", err)
	require.Positive(t, rd.statsFor("bad").BadChunks.Load())
}

package peers

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// closedWithin says whether the server closes c (a read ends in EOF or a
// reset, not the test's own deadline) within d.
func closedWithin(c net.Conn, d time.Duration) (bool, time.Duration) {
	start := time.Now()
	c.SetReadDeadline(start.Add(d))
	_, err := io.ReadAll(c)
	return err == nil || !errors.Is(err, os.ErrDeadlineExceeded), time.Since(start)
}

// TestDataPlaneDeadlines: on both data planes, a connection that never
// completes the handshake is closed at the handshake deadline; a member's
// connection with no request is closed at the idle deadline, and the
// member's next request dials again; a connection busy with answers the
// server sends slowly (longer than the idle deadline in all) is not
// closed under them. Before, a bare connection was held without end (TLS)
// and an idle member's for ever.
func TestDataPlaneDeadlines(t *testing.T) {
	for _, plain := range []bool{false, true} {
		name := "tls"
		if plain {
			name = "plaintext"
		}
		t.Run(name, func(t *testing.T) {
			key, _ := NewKey()
			a, err := startNodeCfg(t, Config{Name: "a", Key: key, Plaintext: plain, NoPlacement: true,
				HandshakeTimeout: 300 * time.Millisecond, IdleTimeout: 500 * time.Millisecond, ServeRate: 4 << 20})
			require.NoError(t, err)

			bare, err := net.Dial("tcp", a.DataAddr())
			require.NoError(t, err)
			defer bare.Close()
			closed, took := closedWithin(bare, 5*time.Second)
			require.True(t, closed, "a connection without a handshake still open after 5 s")
			require.Less(t, took, 3*time.Second)

			cc, err := dialPeer(context.Background(), a.DataAddr(), a.sec)
			require.NoError(t, err)
			_, _, err = cc.roundTrip(context.Background(), request{op: opObject}, maxObject)
			require.NoError(t, err)
			start := time.Now()
			eventually(t, "the idle connection closed by the server", cc.dead)
			require.Less(t, time.Since(start), 5*time.Second)

			// 6 MiB served at 4 MiB/s, all asked at once on one
			// connection: 1.5 s of answers, three idle deadlines.
			data := randBytes(6 << 20)
			importBytes(t, a, "f", data)
			f, _, err := a.s.OpenPath("f")
			require.NoError(t, err)
			cc, err = dialPeer(context.Background(), a.DataAddr(), a.sec)
			require.NoError(t, err)
			defer cc.close(net.ErrClosed)
			start = time.Now()
			var wg sync.WaitGroup
			errs := make(chan error, len(f.M.Chunks))
			for _, c := range f.M.Chunks {
				wg.Add(1)
				go func() {
					defer wg.Done()
					st, _, err := cc.roundTrip(context.Background(), request{op: opChunk, id: c.ID, len: c.Len}, c.Len)
					if err == nil && st != stOK {
						err = errors.New("not ok")
					}
					errs <- err
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err, "a request on a connection busy with slow answers")
			}
			require.Greater(t, time.Since(start), time.Second, "the answers came faster than the test assumes")

			// The pool dials again after the server closed an idle
			// connection: a request through the node works.
			b, err := startNodeCfg(t, Config{Name: "b", Key: key, Plaintext: plain, NoPlacement: true, Join: []string{a.cfg.Listen}})
			require.NoError(t, err)
			eventually(t, "two alive members", func() bool { return len(b.livePeers()) == 1 })
			p := b.livePeers()[0]
			_, err = b.request(context.Background(), p, request{op: opObject}, maxObject)
			require.NoError(t, err)
			pl := b.poolFor(p.addr)
			eventually(t, "the pool's connections closed by the idle server", func() bool {
				pl.mu.Lock()
				defer pl.mu.Unlock()
				for _, cc := range pl.cs {
					if cc != nil && !cc.dead() {
						return false
					}
				}
				return true
			})
			_, err = b.request(context.Background(), p, request{op: opObject}, maxObject)
			require.NoError(t, err, "a request after the server closed the idle connection")
		})
	}
}

// TestDataPlaneConnCap: connections from one address beyond its cap
// (maxConnsPerAddr, less with a low RLIMIT_NOFILE) are closed at once and
// counted; once they close, their slots are free again.
func TestDataPlaneConnCap(t *testing.T) {
	key, _ := NewKey()
	a, err := startNodeCfg(t, Config{Name: "a", Key: key, NoPlacement: true})
	require.NoError(t, err)
	perAddr, _ := dataPlaneCaps()
	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	for range perAddr + 20 {
		c, err := net.Dial("tcp", a.DataAddr())
		require.NoError(t, err)
		flood = append(flood, c)
	}
	lim := a.srv.limits
	eventually(t, "the connections over the cap refused", func() bool { return lim.Refused() == 20 })
	require.Equal(t, perAddr, lim.Held())
	_, err = dialPeer(context.Background(), a.DataAddr(), a.sec)
	require.Error(t, err, "a connection over the cap was served")
	for _, c := range flood {
		c.Close()
	}
	flood = nil
	eventually(t, "the slots given back", func() bool { return lim.Held() == 0 })
	cc, err := dialPeer(context.Background(), a.DataAddr(), a.sec)
	require.NoError(t, err)
	defer cc.close(net.ErrClosed)
	_, _, err = cc.roundTrip(context.Background(), request{op: opObject}, maxObject)
	require.NoError(t, err)
}

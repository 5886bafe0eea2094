package peers

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFrameRoundTrip(t *testing.T) {
	rq := request{op: opChunk, len: 4096}
	rq.id[0], rq.id[31] = 1, 2
	b := appendFrame(nil, rq.op, 7, encodeRequest(rq))
	f, err := readFrame(bytes.NewReader(b), maxRequest)
	require.NoError(t, err)
	require.EqualValues(t, 7, f.id)
	got, err := decodeRequest(f)
	require.NoError(t, err)
	require.Equal(t, rq, got)

	// A frame longer than the limit is refused before its payload is read.
	_, err = readFrame(bytes.NewReader(appendFrame(nil, opChunk, 1, make([]byte, 100))), maxRequest)
	require.ErrorIs(t, err, errProtocol)
	// A frame cut short is an unexpected EOF, not a clean end.
	_, err = readFrame(bytes.NewReader(b[:len(b)-1]), maxRequest)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
}

// FuzzReadRequest feeds arbitrary bytes to the server's request decoder: it
// must never panic nor allocate past the limit, and what it accepts must
// encode back to the same bytes.
func FuzzReadRequest(f *testing.F) {
	rq := request{op: opChunk, len: 1 << 20}
	f.Add(appendFrame(nil, opChunk, 1, encodeRequest(rq)))
	f.Add(appendFrame(nil, opObject, 2, make([]byte, 32)))
	f.Add(appendFrame(nil, 9, 3, nil))
	f.Add([]byte{1, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff})
	f.Add(appendFrame(nil, opHas, 4, make([]byte, 64)))
	f.Add(appendFrame(nil, opPut, 5, appendPut(nil, [32]byte{1}, []byte("abc"))))
	f.Add(appendFrame(nil, opLastRead, 6, make([]byte, 96)))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		for {
			fr, err := readRequest(r)
			if err != nil {
				if err != io.EOF && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, errProtocol) {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			big := fr.kind == opHas || fr.kind == opLastRead || fr.kind == opKVHas || fr.kind == opPut || fr.kind == opKVPut
			if len(fr.payload) > maxRequest && !big || len(fr.payload) > maxPut {
				t.Fatalf("payload of %d bytes passed the limit", len(fr.payload))
			}
			rq, err := decodeRequest(fr)
			if err != nil {
				if !errors.Is(err, errProtocol) {
					t.Fatalf("unexpected error %v", err)
				}
				continue
			}
			if !bytes.Equal(encodeRequest(rq), fr.payload) {
				t.Fatalf("request %+v does not encode back to %x", rq, fr.payload)
			}
		}
	})
}

// FuzzReadAnswers feeds arbitrary bytes to the client's answer decoder as
// if a peer sent them: it must never panic, never hand a caller more than
// it asked for, and always complete the caller's request.
func FuzzReadAnswers(f *testing.F) {
	f.Add(appendFrame(nil, stOK, 1, []byte("chunk")))
	f.Add(appendFrame(nil, stNotFound, 1, nil))
	f.Add(appendFrame(nil, stError, 1, []byte("no")))
	f.Add(append(appendFrame(nil, stOK, 7, make([]byte, 10)), appendFrame(nil, stOK, 1, make([]byte, 64))...))
	f.Add(appendFrame(nil, stOK, 1, make([]byte, 65)))
	f.Fuzz(func(t *testing.T, b []byte) {
		c1, c2 := net.Pipe()
		cc := &clientConn{c: c1, bw: bufio.NewWriter(c1), pending: map[uint32]*call{}}
		cl := &call{max: 64, done: make(chan struct{})}
		cc.pending[1] = cl
		done := make(chan struct{})
		go func() { cc.readLoop(); close(done) }()
		c2.Write(b) // fails once the client closed its end: fine
		c2.Close()
		<-done
		<-cl.done
		if cl.err != nil {
			return
		}
		switch cl.status {
		case stOK:
			if len(cl.data) > 64 {
				t.Fatalf("answer of %d bytes passed a limit of 64", len(cl.data))
			}
		case stNotFound:
			if len(cl.data) != 0 {
				t.Fatalf("not-found answer with %d bytes", len(cl.data))
			}
		case stError:
			if len(cl.data) > maxErrorLen {
				t.Fatalf("error answer of %d bytes", len(cl.data))
			}
		default:
			t.Fatalf("status %d accepted", cl.status)
		}
	})
}

// TestPutRoundTrip: an opPut payload splits back into its chunks, and a
// cut or empty one is a protocol error.
func TestPutRoundTrip(t *testing.T) {
	p := appendPut(appendPut(nil, [32]byte{1}, []byte("abc")), [32]byte{2}, []byte("defgh"))
	pc, err := decodePut(p)
	if err != nil || len(pc) != 2 || string(pc[0].data) != "abc" || pc[1].id != [32]byte{2} || string(pc[1].data) != "defgh" {
		t.Fatalf("decodePut: %v %+v", err, pc)
	}
	for _, bad := range [][]byte{nil, p[:len(p)-1], p[:40], appendPut(nil, [32]byte{3}, nil)} {
		if _, err := decodePut(bad); !errors.Is(err, errProtocol) {
			t.Errorf("decodePut(%d bytes): %v, want a protocol error", len(bad), err)
		}
	}
}

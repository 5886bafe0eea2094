package peers

import (
	"bytes"
	"errors"
	"io"
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
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		for {
			fr, err := readFrame(r, maxRequest)
			if err != nil {
				if err != io.EOF && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, errProtocol) {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if len(fr.payload) > maxRequest {
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

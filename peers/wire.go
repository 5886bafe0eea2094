package peers

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"sync"
)

// The data plane's wire format (docs/design/peers.md). A connection starts
// with the client's 4-byte magic; then both sides send frames:
//
//	kind   1 byte   request: an op; response: a status
//	id     4 bytes  big-endian request id, chosen by the client, echoed back
//	length 4 bytes  big-endian payload length
//	payload
//
// Requests are pipelined: a client sends many before the first answer, and
// the server answers in any order (by id).
const wireMagic = "KXP1"

// Ops (request kinds).
const (
	// opChunk asks for a chunk: payload = 32-byte id, 4-byte length.
	opChunk byte = 1
	// opObject asks for a manifest: payload = 32-byte id.
	opObject byte = 2
	// opHas asks which of up to maxHasIDs chunks the member stores in its
	// packs: payload = 32-byte ids; answer = one byte per id, 1 if held.
	opHas byte = 3
	// opPut gives the member chunks to store (push, push.go): payload =
	// repeated 32-byte id, 4-byte length, bytes; at most maxPut bytes. The
	// member verifies each against its id and commits them before it
	// answers ok.
	opPut byte = 4
	// opRelay asks a chunk's relay for it (relay.go): as opChunk, but a
	// member that does not hold the chunk fetches it from the holders.
	opRelay byte = 5
	// opKVGet asks for a KV-cache block (kv.go): payload = 4-byte
	// namespace, 32-byte key; answer = its 32-byte BLAKE3, then the block.
	opKVGet byte = 6
	// opKVPut gives the member a KV-cache block to keep: payload =
	// namespace, key, BLAKE3, 4-byte length, the block (at most maxPut in
	// all). The member checks the BLAKE3 and stores it before it answers.
	opKVPut byte = 7
	// opKVHas asks which of up to maxHasIDs blocks of one namespace the
	// member keeps: payload = 4-byte namespace, 32-byte keys; answer = one
	// byte per key, 1 if kept.
	opKVHas byte = 8
	// opLastRead asks for the last day each of up to maxHasIDs file
	// versions was read on the member (serve --cold-after, tier.go):
	// payload = 32-byte manifest ids; answer = 4 bytes a id, big-endian,
	// the Unix day after the last read (0: never read there).
	opLastRead byte = 9
)

// Statuses (response kinds).
const (
	stOK       byte = 0 // payload: the bytes asked for
	stNotFound byte = 1 // the member does not hold it; empty payload
	stError    byte = 2 // payload: a message (at most maxErrorLen bytes)
)

const (
	frameHeader = 9
	// maxRequest bounds a request's payload.
	maxRequest = 64
	// maxErrorLen bounds an error message in a response.
	maxErrorLen = 1024
	// maxObject bounds a manifest sent over the data plane.
	maxObject = 256 << 20
	// maxHasIDs bounds the ids of one opHas request.
	maxHasIDs = 4096
	// maxPut bounds an opPut request's payload.
	maxPut = 64 << 20
)

// readRequest reads one request frame with its op's payload limit, checked
// before anything is allocated.
func readRequest(r io.Reader) (frame, error) {
	var hdr [frameHeader]byte
	kind, id, n, err := readHeader(r, &hdr)
	if err != nil {
		return frame{}, err
	}
	max := uint32(maxRequest)
	switch kind {
	case opHas, opLastRead:
		max = maxHasIDs * 32
	case opKVHas:
		max = 4 + maxHasIDs*32
	case opPut, opKVPut:
		max = maxPut
	}
	if n > max {
		return frame{}, fmt.Errorf("frame of %d bytes (at most %d): %w", n, max, errProtocol)
	}
	f := frame{kind: kind, id: id, payload: make([]byte, n)}
	if _, err := io.ReadFull(r, f.payload); err != nil {
		return frame{}, noEOF(err)
	}
	return f, nil
}

// errProtocol marks a peer that broke the wire format.
var errProtocol = errors.New("peer broke the data plane protocol")

type frame struct {
	kind    byte
	id      uint32
	payload []byte
}

func appendFrame(b []byte, kind byte, id uint32, payload []byte) []byte {
	b = append(b, kind)
	b = binary.BigEndian.AppendUint32(b, id)
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	return append(b, payload...)
}

// putHeader encodes a frame header for a payload of n bytes into b[:frameHeader].
func putHeader(b []byte, kind byte, id uint32, n int) {
	b[0] = kind
	binary.BigEndian.PutUint32(b[1:5], id)
	binary.BigEndian.PutUint32(b[5:9], uint32(n))
}

// Frame buffers for chunks sent from the packs are pooled by size class:
// class k holds buffers of frameHeader + 2^k bytes, so a chunk is read into
// its frame behind the header's room and written in one call, and the
// buffer serves the next chunk once written (no allocation, no zeroing per
// chunk). Chunks above 2^maxFrameShift bytes get a buffer of their own.
const (
	minFrameShift = 12 // 4 KiB
	maxFrameShift = 26 // 64 MiB
)

var framePools [maxFrameShift + 1]sync.Pool

// frameClass is the size class of a payload of n bytes, -1 if not pooled.
func frameClass(n int) int {
	k := max(bits.Len(uint(max(n, 1)-1)), minFrameShift)
	if k > maxFrameShift {
		return -1
	}
	return k
}

// getFrame returns a frame buffer of frameHeader+n bytes; its contents are
// whatever the last user left. Give it back with putFrame once written,
// and keep no reference to it then.
func getFrame(n int) *[]byte {
	k := frameClass(n)
	if k < 0 {
		b := make([]byte, frameHeader+n)
		return &b
	}
	if v := framePools[k].Get(); v != nil {
		b := v.(*[]byte)
		*b = (*b)[:frameHeader+n]
		return b
	}
	b := make([]byte, frameHeader+n, frameHeader+1<<k)
	return &b
}

// putFrame gives back a buffer from getFrame.
func putFrame(b *[]byte) {
	if k := frameClass(cap(*b) - frameHeader); k >= 0 && cap(*b) == frameHeader+1<<k {
		framePools[k].Put(b)
	}
}

// readHeader reads one frame header.
func readHeader(r io.Reader, hdr *[frameHeader]byte) (kind byte, id, n uint32, err error) {
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, 0, 0, err
	}
	return hdr[0], binary.BigEndian.Uint32(hdr[1:5]), binary.BigEndian.Uint32(hdr[5:9]), nil
}

// readFrame reads one whole frame whose payload may be at most max bytes:
// a longer one is a protocol error, found before anything is allocated.
func readFrame(r io.Reader, max uint32) (frame, error) {
	var hdr [frameHeader]byte
	kind, id, n, err := readHeader(r, &hdr)
	if err != nil {
		return frame{}, err
	}
	if n > max {
		return frame{}, fmt.Errorf("frame of %d bytes (at most %d): %w", n, max, errProtocol)
	}
	f := frame{kind: kind, id: id, payload: make([]byte, n)}
	if _, err := io.ReadFull(r, f.payload); err != nil {
		return frame{}, noEOF(err)
	}
	return f, nil
}

// noEOF turns an EOF inside a frame into ErrUnexpectedEOF.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// request is a decoded request payload.
type request struct {
	op  byte
	id  [32]byte
	len uint32 // opChunk only
	// raw is the payload of opHas, opPut and the KV ops, checked by
	// decodeRequest.
	raw []byte
	// into, never sent: memory of the caller's that an ok answer of len
	// bytes to a chunk request is read into, instead of a new buffer
	// (Node.FetchInto; roundTrip).
	into []byte
}

// decodeRequest checks a request frame's op and payload.
func decodeRequest(f frame) (request, error) {
	rq := request{op: f.kind}
	switch f.kind {
	case opChunk, opRelay:
		if len(f.payload) != 36 {
			return rq, fmt.Errorf("chunk request of %d bytes: %w", len(f.payload), errProtocol)
		}
		copy(rq.id[:], f.payload)
		rq.len = binary.BigEndian.Uint32(f.payload[32:])
		if rq.len == 0 || rq.len > 1<<30 {
			return rq, fmt.Errorf("chunk request for %d bytes: %w", rq.len, errProtocol)
		}
	case opObject:
		if len(f.payload) != 32 {
			return rq, fmt.Errorf("object request of %d bytes: %w", len(f.payload), errProtocol)
		}
		copy(rq.id[:], f.payload)
	case opHas, opLastRead:
		if len(f.payload) == 0 || len(f.payload)%32 != 0 || len(f.payload) > maxHasIDs*32 {
			return rq, fmt.Errorf("has request of %d bytes: %w", len(f.payload), errProtocol)
		}
		rq.raw = f.payload
	case opPut:
		if _, err := decodePut(f.payload); err != nil {
			return rq, err
		}
		rq.raw = f.payload
	case opKVGet, opKVPut, opKVHas:
		if err := decodeKV(f.kind, f.payload); err != nil {
			return rq, err
		}
		rq.raw = f.payload
	default:
		return rq, fmt.Errorf("unknown op %d: %w", f.kind, errProtocol)
	}
	return rq, nil
}

func encodeRequest(rq request) []byte {
	if rq.op == opHas || rq.op == opLastRead || rq.op == opPut || rq.op == opKVGet || rq.op == opKVPut || rq.op == opKVHas {
		return rq.raw
	}
	p := append([]byte(nil), rq.id[:]...)
	if rq.op == opChunk || rq.op == opRelay {
		p = binary.BigEndian.AppendUint32(p, rq.len)
	}
	return p
}

// putChunk is one chunk of an opPut payload.
type putChunk struct {
	id   [32]byte
	data []byte
}

// decodePut splits an opPut payload into its chunks (slices of it).
func decodePut(p []byte) ([]putChunk, error) {
	if len(p) == 0 || len(p) > maxPut {
		return nil, fmt.Errorf("put request of %d bytes: %w", len(p), errProtocol)
	}
	var out []putChunk
	for len(p) > 0 {
		if len(p) < 36 {
			return nil, fmt.Errorf("put request cut inside a chunk header: %w", errProtocol)
		}
		var c putChunk
		copy(c.id[:], p)
		n := binary.BigEndian.Uint32(p[32:36])
		if n == 0 || uint64(n) > uint64(len(p)-36) {
			return nil, fmt.Errorf("put request with a chunk of %d bytes: %w", n, errProtocol)
		}
		c.data = p[36 : 36+n]
		p = p[36+n:]
		out = append(out, c)
	}
	return out, nil
}

// appendPut appends one chunk to an opPut payload.
func appendPut(b []byte, id [32]byte, data []byte) []byte {
	b = append(b, id[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

package clientproto

import (
	"errors"
	"reflect"
	"syscall"
	"testing"
)

// TestLayouts pins the sizes the C and Python clients mirror.
func TestLayouts(t *testing.T) {
	if n := len(AppendHeader(nil, Header{})); n != HeaderSize {
		t.Errorf("header %d bytes", n)
	}
	if n := len(FillRequest{}.Append(nil)); n != FillFixedSize {
		t.Errorf("FILL fixed part %d bytes", n)
	}
	if n := len(StatReply{}.Append(nil)); n != StatReplySize {
		t.Errorf("STAT reply %d bytes", n)
	}
	if n := len(FillReply{}.Append(nil)); n != FillReplySize {
		t.Errorf("FILL reply %d bytes", n)
	}
	if n := len(AppendPacks(nil, []PackEntry{{}})); n != 4+PackEntrySize {
		t.Errorf("PACKS entry %d bytes", n)
	}
	if MaxRequest != 98424 {
		t.Errorf("MaxRequest %d", MaxRequest)
	}
}

func TestRoundTrips(t *testing.T) {
	fr := FillRequest{Device: 3, Flags: FillVerify, DstOffset: 1, FileOffset: 2, Length: 3,
		Ranges: []Range{{FileOffset: 1, Length: 2, DstOffset: 3}, {FileOffset: 4, Length: 5, DstOffset: 6}}}
	fr.IPCHandle[0], fr.IPCHandle[63] = 7, 9
	got, err := ParseFill(fr.Append(nil))
	if err != nil || !reflect.DeepEqual(got, fr) {
		t.Errorf("FILL: %+v %v", got, err)
	}
	sr := FillRequest{Device: 1, Flags: FillStrided,
		Ranges: []Range{{FileOffset: 1, Length: 2, DstOffset: 3, Rows: 4, Pitch: 5}, {FileOffset: 6, Length: 7, DstOffset: 8}}}
	b := sr.Append(nil)
	if len(b) != FillFixedSize+2*StridedRangeSize {
		t.Errorf("strided FILL of %d bytes", len(b))
	}
	if got, err := ParseFill(b); err != nil || !reflect.DeepEqual(got, sr) {
		t.Errorf("strided FILL: %+v %v", got, err)
	}
	es := []PackEntry{{1, 3, 99, 1 << 40}}
	if g, err := ParsePacks(AppendPacks(nil, es)); err != nil || !reflect.DeepEqual(g, es) {
		t.Errorf("PACKS: %+v %v", g, err)
	}
	rep := FillReply{Bytes: 5, Nanos: 6, Path: "bounce", IO: "page cache + O_DIRECT and a very long name", Verified: "device"}
	g, err := ParseFillReply(rep.Append(nil))
	if err != nil || g.Path != "bounce" || g.IO != rep.IO[:31] || g.Verified != "device" {
		t.Errorf("FILL reply: %+v %v", g, err)
	}
	msg := Reply(OpStat, 9, -int32(syscall.EBUSY), "busy", []byte{1, 2})
	h, st, m, f, err := ParseReply(msg)
	if err != nil || h.Op != OpStat|ReplyBit || h.Seq != 9 || st != -int32(syscall.EBUSY) || m != "busy" || len(f) != 2 {
		t.Errorf("reply: %+v %d %q %v %v", h, st, m, f, err)
	}
}

func TestParseErrors(t *testing.T) {
	good := Request(OpStat, 1, nil)
	bad := func(mut func([]byte) []byte) []byte { return mut(append([]byte(nil), good...)) }
	for _, c := range []struct {
		b    []byte
		want syscall.Errno
	}{
		{good[:5], syscall.EINVAL},
		{bad(func(b []byte) []byte { b[0] = 0; return b }), syscall.EPROTO},
		{bad(func(b []byte) []byte { b[4] = 2; return b }), syscall.EPROTONOSUPPORT},
		{bad(func(b []byte) []byte { return append(b, 1) }), syscall.EINVAL},
	} {
		if _, _, err := ParseHeader(c.b); !errors.Is(err, c.want) || Errno(err) != c.want {
			t.Errorf("%x: %v, want %v", c.b, err, c.want)
		}
	}
	fr := FillRequest{Ranges: []Range{{}}}.Append(nil)
	for _, b := range [][]byte{fr[:50], fr[:len(fr)-1], append(fr, 0)} {
		if _, err := ParseFill(b); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("FILL of %d bytes: %v", len(b), err)
		}
	}
	fr[100] = 1 // reserved
	if _, err := ParseFill(fr); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("reserved set: %v", err)
	}
	// A plain request read as strided, and the strided range limit.
	plain := FillRequest{Ranges: []Range{{}, {}, {}, {}, {}}}.Append(nil)
	plain[4] = FillStrided
	if _, err := ParseFill(plain); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("plain ranges flagged strided: %v", err)
	}
	many := FillRequest{Flags: FillStrided, Ranges: make([]Range, MaxStridedRanges+1)}.Append(nil)
	if _, err := ParseFill(many); !errors.Is(err, syscall.E2BIG) {
		t.Errorf("%d strided ranges: %v", MaxStridedRanges+1, err)
	}
	if HeaderSize+len(many)-StridedRangeSize > MaxRequest {
		t.Errorf("the largest strided FILL (%d bytes) exceeds MaxRequest", HeaderSize+len(many)-StridedRangeSize)
	}
}

// FuzzParse: no input panics the node's decoders.
func FuzzParse(f *testing.F) {
	f.Add(Request(OpFill, 1, FillRequest{Ranges: []Range{{FileOffset: 1, Length: 2, DstOffset: 3}}}.Append(nil)))
	f.Add(Request(OpFill, 1, FillRequest{Flags: FillStrided, Ranges: []Range{{FileOffset: 1, Length: 2, DstOffset: 3, Rows: 4, Pitch: 5}}}.Append(nil)))
	f.Add(Reply(OpPacks, 1, 0, "x", AppendPacks(nil, []PackEntry{{}})))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, body, err := ParseHeader(b); err == nil {
			ParseFill(body)
		}
		if _, _, _, fields, err := ParseReply(b); err == nil {
			ParsePacks(fields)
			ParseStat(fields)
			ParseFillReply(fields)
		}
	})
}

// TestPacksRequest: the optional PACKS body (flags) and what it refuses.
func TestPacksRequest(t *testing.T) {
	if f, err := ParsePacksRequest(nil); err != nil || f != 0 {
		t.Errorf("empty body: %d %v", f, err)
	}
	b := AppendPacksRequest(nil, PacksShared)
	if len(b) != PacksRequestSize {
		t.Fatalf("body %d bytes", len(b))
	}
	if f, err := ParsePacksRequest(b); err != nil || f != PacksShared {
		t.Errorf("shared: %d %v", f, err)
	}
	for _, bad := range [][]byte{{1}, AppendPacksRequest(nil, 2), append(AppendPacksRequest(nil, 1), 0), {1, 0, 0, 0, 1, 0, 0, 0}} {
		if _, err := ParsePacksRequest(bad); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%x: %v, want EINVAL", bad, err)
		}
	}
}

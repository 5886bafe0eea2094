package layout

import (
	"errors"
	"testing"
)

func TestRequestRoundTrip(t *testing.T) {
	b := EncodeRequest(Request{Offset: 4096, Length: 1 << 20})
	r, err := DecodeRequest(b)
	if err != nil || r.Offset != 4096 || r.Length != 1<<20 {
		t.Fatalf("%+v %v", r, err)
	}
	rep := Reply{FileSize: 10, NextOffset: 10, Extents: []Extent{{FileOffset: 0, Length: 10, PackID: 3, PackOffset: 8192, Flags: ExtentLocal}}}
	if err := EncodeReply(b, rep); err != nil {
		t.Fatal(err)
	}
	got, err := DecodeReply(b)
	if err != nil || len(got.Extents) != 1 || got.Extents[0] != rep.Extents[0] {
		t.Fatalf("%+v %v", got, err)
	}
	if _, err := DecodeRequest(b[:10]); !errors.Is(err, ErrInvalid) {
		t.Errorf("short request: %v", err)
	}
}

func FuzzDecodeRequest(f *testing.F) {
	f.Add(EncodeRequest(Request{}))
	f.Add(EncodePackPathRequest(1))
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := DecodeRequest(b); err == nil {
			if r.Offset+r.Length < r.Offset {
				t.Fatalf("accepted an overflowing range %+v", r)
			}
		}
		DecodePackPathRequest(b)
		DecodeReply(b)
		DecodePackPathReply(b)
	})
}

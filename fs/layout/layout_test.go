package layout

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestHeaderAgrees compiles a C program against kylix_layout.h and checks
// that the struct sizes and ioctl numbers match this package.
func TestHeaderAgrees(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler (cc) to check kylix_layout.h against")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "h.c")
	os.WriteFile(src, []byte(`#include <stdio.h>
#include <stddef.h>
#include "kylix_layout.h"
int main(void) {
	printf("%zu %zu %zu %lu %lu %zu %zu\n", sizeof(struct kylix_layout), sizeof(struct kylix_extent),
		sizeof(struct kylix_pack_path), (unsigned long)KYLIX_IOC_LAYOUT, (unsigned long)KYLIX_IOC_PACK_PATH,
		offsetof(struct kylix_layout, ext), offsetof(struct kylix_pack_path, path));
	return 0;
}
`), 0o644)
	wd, _ := os.Getwd()
	bin := filepath.Join(dir, "h")
	if out, err := exec.Command(cc, "-Wall", "-Werror", "-I", wd, "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for _, f := range strings.Fields(string(out)) {
		v, _ := strconv.ParseUint(f, 10, 64)
		got = append(got, v)
	}
	want := []uint64{LayoutSize, extentSize, PackPathSize, uint64(CmdLayout), uint64(CmdPackPath), headerSize, 24}
	for i := range want {
		if i >= len(got) || got[i] != want[i] {
			t.Fatalf("C says %v, Go says %v", got, want)
		}
	}
}

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

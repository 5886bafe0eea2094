package storeio

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"unsafe"
)

func newTestRing(t *testing.T, entries uint32) *ring {
	t.Helper()
	rg, err := newRing(entries)
	if err != nil {
		if err := unavailable("io_uring_setup", err); errors.Is(err, ErrUnavailable) {
			t.Skipf("io_uring unavailable: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(rg.close)
	return rg
}

// The probe answers per opcode: READ and NOP are there on every kernel we
// accept, an opcode past the kernel's last is not.
func TestRingSupports(t *testing.T) {
	rg := newTestRing(t, 4)
	for _, tc := range []struct {
		op   uint8
		want bool
	}{{opNop, true}, {opRead, true}, {255, false}} {
		got, err := rg.supports(tc.op)
		if err != nil || got != tc.want {
			t.Errorf("supports(%d) = %v, %v; want %v", tc.op, got, err, tc.want)
		}
	}
}

// The SQ holds exactly its entries: getSQE says so by returning nil, and the
// slots come back once submitted. Many rounds run the ring indexes through
// several wraps of the masks; every CQE comes back once with its user_data.
func TestRingFullAndWrap(t *testing.T) {
	rg := newTestRing(t, 8)
	if rg.sqEntries != 8 || len(rg.cqes) != 16 {
		t.Fatalf("ring has %d SQEs and %d CQEs, want 8 and 16", rg.sqEntries, len(rg.cqes))
	}
	next := uint64(0)
	for round := range 20 {
		n := 1 + round%int(rg.sqEntries) // vary the batch so heads land everywhere
		if round%3 == 0 {
			n = int(rg.sqEntries)
		}
		for range n {
			s := rg.getSQE()
			if s == nil {
				t.Fatalf("round %d: SQ full after fewer than %d SQEs", round, n)
			}
			s.prepNop(next)
			next++
		}
		if n == int(rg.sqEntries) && rg.getSQE() != nil {
			t.Fatalf("round %d: getSQE gave a 9th SQE on an 8-entry SQ", round)
		}
		if got, err := rg.submit(); err != nil || got != n {
			t.Fatalf("round %d: submit = %d, %v; want %d", round, got, err, n)
		}
		seen := map[uint64]bool{}
		for range n {
			ud, res, err := rg.waitCQE()
			if err != nil || res != 0 || ud >= next || ud < next-uint64(n) || seen[ud] {
				t.Fatalf("round %d: CQE user_data %d res %d err %v (want each of %d..%d once)", round, ud, res, err, next-uint64(n), next-1)
			}
			seen[ud] = true
		}
	}
}

// A READ SQE reads the file into the buffer and its CQE carries the count; a
// read of a closed fd carries -EBADF.
func TestRingRead(t *testing.T) {
	rg := newTestRing(t, 4)
	want := bytes.Repeat([]byte("0123456789abcdef"), 1000)
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, want, 0o644); err != nil {
		t.Fatal(err)
	}
	f := openRead(t, path)
	buf := make([]byte, 5000)
	rg.getSQE().prepRead(int(f.Fd()), unsafe.Pointer(&buf[0]), uint32(len(buf)), 100, 7)
	rg.getSQE().prepRead(-1, unsafe.Pointer(&buf[0]), 1, 0, 8)
	if n, err := rg.submit(); err != nil || n != 2 {
		t.Fatalf("submit = %d, %v", n, err)
	}
	for range 2 {
		ud, res, err := rg.waitCQE()
		switch {
		case err != nil:
			t.Fatal(err)
		case ud == 7:
			if res != int32(len(buf)) || !bytes.Equal(buf, want[100:100+len(buf)]) {
				t.Errorf("read: res %d, bytes equal %v", res, bytes.Equal(buf, want[100:100+len(buf)]))
			}
		case ud == 8:
			if syscall.Errno(-res) != syscall.EBADF {
				t.Errorf("read of fd -1: res %d, want -EBADF", res)
			}
		default:
			t.Errorf("unexpected user_data %d", ud)
		}
	}
}

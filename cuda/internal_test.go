package cuda

import (
	"encoding/json"
	"errors"
	"math"
	"testing"
)

func TestUseCount(t *testing.T) {
	var u useCount
	if err := u.acquire("x"); err != nil {
		t.Fatal(err)
	}
	if err := u.markFreed("free"); !errors.Is(err, ErrBusy) {
		t.Fatalf("free while busy: %v, want ErrBusy", err)
	}
	u.release()
	if err := u.markFreed("free"); err != nil {
		t.Fatalf("free when idle: %v", err)
	}
	if err := u.markFreed("free"); !errors.Is(err, ErrFreed) {
		t.Fatalf("second free: %v, want ErrFreed", err)
	}
	if err := u.acquire("x"); !errors.Is(err, ErrFreed) {
		t.Fatalf("use after free: %v, want ErrFreed", err)
	}
}

func TestAcquireAllRollsBack(t *testing.T) {
	var a, b useCount
	b.freed = true
	if err := acquireAll([]string{"a", "b"}, []*useCount{&a, &b}); !errors.Is(err, ErrFreed) {
		t.Fatalf("got %v", err)
	}
	if a.busy() != 0 {
		t.Fatalf("a left acquired")
	}
}

func TestCheckRange(t *testing.T) {
	for _, c := range []struct {
		size, off, n int
		ok           bool
	}{
		{10, 0, 10, true}, {10, 10, 0, true}, {10, 5, 5, true},
		{10, 5, 6, false}, {10, -1, 1, false}, {10, 0, -1, false},
		{10, 11, 0, false}, {math.MaxInt, math.MaxInt, math.MaxInt, false},
	} {
		err := checkRange("t", c.size, c.off, c.n)
		if (err == nil) != c.ok {
			t.Errorf("checkRange(%d,%d,%d) = %v", c.size, c.off, c.n, err)
		}
		if err != nil && !errors.Is(err, ErrRange) {
			t.Errorf("not ErrRange: %v", err)
		}
	}
}

func TestStripJSONComments(t *testing.T) {
	in := `{
  // comment "with quotes"
  "logging": { "dir": "/var/log//cufile", "level": "ERROR" }, /* block
  comment */
  "properties": {
     "allow_compat_mode": false, // trailing
     "use_pci_p2pdma": true,
  },
}`
	var v struct {
		Logging    struct{ Dir string }
		Properties struct {
			AllowCompatMode bool `json:"allow_compat_mode"`
			UsePCIP2PDMA    bool `json:"use_pci_p2pdma"`
		}
	}
	if err := json.Unmarshal(stripJSONComments([]byte(in)), &v); err != nil {
		t.Fatalf("%v\n%s", err, stripJSONComments([]byte(in)))
	}
	if v.Logging.Dir != "/var/log//cufile" || v.Properties.AllowCompatMode || !v.Properties.UsePCIP2PDMA {
		t.Fatalf("parsed %+v", v)
	}
}

func TestFileErr(t *testing.T) {
	if fileErr(nil, "op", 0) != nil {
		t.Fatal("success is an error")
	}
	// err = CU_FILE_CUDA_DRIVER_ERROR (5011), cu_err = 2 (out of memory)
	r := uint64(5011) | uint64(2)<<32
	err := fileErr(nil, "cuFileBufRegister", r)
	var fe *FileError
	if !errors.As(err, &fe) || fe.Name != "CU_FILE_CUDA_DRIVER_ERROR" || fe.CUDA == nil || fe.CUDA.Code != 2 {
		t.Fatalf("got %#v", err)
	}
	if !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("cu_err out of memory not matched: %v", err)
	}
	t.Log(err)
}

func TestDescrLayout(t *testing.T) {
	d := cufileDescr{typ: cuFileHandleTypeOpaqueFD, fd: 7}
	if sz := sizeofDescr(); sz != 24 {
		t.Fatalf("CUfileDescr_t is %d bytes, want 24", sz)
	}
	if off := offsetofFd(&d); off != 8 {
		t.Fatalf("fd at %d, want 8", off)
	}
	if off := offsetofDstatus(); off != 24 {
		t.Fatalf("dstatusflags at %d, want 24", off)
	}
	if off := offsetofFflags(); off != 32 {
		t.Fatalf("fflags at %d, want 32", off)
	}
}

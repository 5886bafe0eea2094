//go:build linux && (amd64 || arm64)

package cuda_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kylix/kylix/cuda"

	"github.com/kylix/kylix/internal/testneeds"
)

// TestStubDriver runs this package's GPU tests against stub builds of
// libcuda.so.1 and libcufile.so.0 (testdata/stub), in a child process, so
// that machines without a GPU still exercise the binding end to end: the
// purego signatures, struct layouts, errno, context push/pop, in-flight
// accounting and the pollers. It needs a C compiler; it is skipped where a
// real driver is present (the real tests run there).
func TestStubDriver(t *testing.T) {
	if os.Getenv("KYLIX_CUDA_STUB") != "" {
		t.Skip("inside the stub run")
	}
	if testing.Short() {
		t.Skip("-short")
	}
	if cuda.Available() == nil {
		t.Skip("a real CUDA driver is available")
	}
	cc := testneeds.Command(t, "cc", "gcc libc6-dev")
	dir := t.TempDir()
	for _, lib := range []struct{ src, so string }{
		{"libcuda.c", "libcuda.so.1"},
		{"libcufile.c", "libcufile.so.0"},
	} {
		out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-o", filepath.Join(dir, lib.so), filepath.Join("testdata", "stub", lib.src)).CombinedOutput()
		if err != nil {
			t.Fatalf("build %s: %v\n%s", lib.so, err, out)
		}
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^Test", "-test.skip", "WaitPolicies|StubDriver|NoGPUHere", "-test.v")
	cmd.Env = append(os.Environ(),
		"LD_LIBRARY_PATH="+dir,
		"KYLIX_CUDA_STUB=1",
		"KYLIX_REQUIRE_GPU=1",
		"KYLIX_TEST_DIR="+t.TempDir(),
		"CUFILE_ENV_PATH_JSON="+filepath.Join(dir, "none.json"),
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("stub run: %v\n%s", err, out)
	}
	if testing.Verbose() {
		t.Logf("stub run:\n%s", out)
	}
}

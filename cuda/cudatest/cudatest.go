// Package cudatest holds test helpers for code that uses package cuda.
package cudatest

import (
	"os"
	"testing"

	"github.com/kylix/kylix/cuda"
)

// RequireGPUEnv names the environment variable that turns RequireGPU's skip
// into a failure, for runs on a GPU machine where skipping would hide a
// broken setup.
const RequireGPUEnv = "KYLIX_REQUIRE_GPU"

// RequireGPU skips the test, with the reason, unless a CUDA device is
// available. With KYLIX_REQUIRE_GPU=1 it fails instead of skipping.
func RequireGPU(tb testing.TB) {
	tb.Helper()
	err := cuda.Available()
	if err == nil {
		var n int
		if n, err = cuda.DeviceCount(); err == nil && n > 0 {
			return
		}
	}
	if os.Getenv(RequireGPUEnv) == "1" {
		tb.Fatalf("GPU required (%s=1) but unavailable: %v", RequireGPUEnv, err)
	}
	tb.Skipf("no GPU: %v", err)
}

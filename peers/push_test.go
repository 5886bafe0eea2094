package peers

import (
	"context"
	"testing"
	"time"
)

// TestLimiter: pulls of 10 × 100 KiB at 1 MiB/s take about a second, not
// less; a limit of 0 does not wait.
func TestLimiter(t *testing.T) {
	l := limiter{rate: 1 << 20}
	start := time.Now()
	for range 11 {
		if err := l.wait(context.Background(), 100<<10); err != nil {
			t.Fatal(err)
		}
	}
	// The first goes at once; the ten after it wait 100 KiB / 1 MiB each.
	if d := time.Since(start); d < 950*time.Millisecond || d > 3*time.Second {
		t.Errorf("11 waits of 100 KiB at 1 MiB/s took %v, want about 1 s", d)
	}
	var none limiter
	start = time.Now()
	for range 1000 {
		none.wait(context.Background(), 1<<30)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("no limit waited %v", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	slow := limiter{rate: 1}
	slow.wait(context.Background(), 10) // the next may go in 10 s
	if err := slow.wait(ctx, 1); err == nil {
		t.Error("a cancelled wait returned no error")
	}
}

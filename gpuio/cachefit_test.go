package gpuio

import (
	"strings"
	"testing"
)

func TestFitsPageCache(t *testing.T) {
	avail, err := MemAvailable()
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := FitsPageCache(avail / 4); !ok || !strings.Contains(why, "through the page cache") {
		t.Errorf("a quarter of available memory: %v %q", ok, why)
	}
	if ok, why := FitsPageCache(avail); ok || !strings.Contains(why, "O_DIRECT") {
		t.Errorf("all of available memory: %v %q", ok, why)
	}
}

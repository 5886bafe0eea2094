package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/internal/damage"
)

// TestWarmVerifies: warm hashes every chunk; a flipped byte in a pack
// fails it (exit 1) with the path and the corruption named.
func TestWarmVerifies(t *testing.T) {
	src := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(src, "f"), bytes.Repeat([]byte("kylix warm "), 300000), 0o644))
	data := t.TempDir()
	mustKylix(t, data, "import", filepath.Join(src, "f"), "m/f")
	r := mustKylix(t, data, "warm", "m")
	require.Contains(t, r.stdout, "warmed m: 1 files")
	var so statOut
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, data, "stat", "--json", "m/f").stdout), &so))
	require.Equal(t, so.Size, *so.LocalBytes, "stat: every byte in this node's packs")
	require.Nil(t, so.PeerCacheBytes, "stat: no peer cache outside a cluster")
	require.Contains(t, mustKylix(t, data, "stat", "m/f").stdout, "here:     3.1 MiB of 3.1 MiB in this node's packs\n")
	damage.FlipByte(t, so.Extent[0].PackPath, so.Extent[0].PackOff+1000)
	r = kylix(t, data, "warm", "m/f")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "warm m/f:")
	require.Contains(t, r.stderr, "corrupt")
}

package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/internal/damage"
)

func TestParsePinBudget(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "64MiB": 64 << 20, "2GiB": 2 << 30, "1g": 1 << 30} {
		got, err := parsePinBudget(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	half, err := parsePinBudget("50%")
	require.NoError(t, err)
	all, err := parsePinBudget("100%")
	require.NoError(t, err)
	require.Greater(t, half, int64(0))
	require.InDelta(t, float64(all)/2, float64(half), 1)
	for _, bad := range []string{"", "abc", "150%", "-1%", "-5MiB"} {
		_, err := parsePinBudget(bad)
		require.Error(t, err, bad)
		require.Contains(t, err.Error(), "pin-budget")
	}
}

func TestPinRecord(t *testing.T) {
	dir := t.TempDir()
	rec, err := readPinRecord(dir)
	require.NoError(t, err)
	require.Empty(t, rec.Pins, "no record: no pins")
	want := pinRecord{Version: 1, Pins: []pinRecordEntry{{Path: "models/a", Added: time.Unix(1700000000, 0).UTC()}}}
	require.NoError(t, writePinRecord(dir, want))
	got, err := readPinRecord(dir)
	require.NoError(t, err)
	require.Equal(t, want, got)
	fi, err := os.Stat(filepath.Join(dir, pinRecordName))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	_, err = os.Stat(filepath.Join(dir, pinRecordName+".tmp"))
	require.ErrorIs(t, err, os.ErrNotExist)
	for _, bad := range []string{"{", `{"version": 2, "pins": []}`} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, pinRecordName), []byte(bad), 0o600))
		_, err = readPinRecord(dir)
		require.ErrorContains(t, err, "not a version 1 record")
	}
}

// TestPinPendingResumed: a pin recorded as pending (a node stopped while
// the pin fetched its chunks from the cluster) is resumed at the next
// start: recorded as a pin (no longer pending) and shown as not held until
// its chunks are here (without a cluster, for good; in one, fetchMissing
// brings them: TestClusterPinResumedAtRestart); the other pins stay, and a
// path kept by MAKE_LOCAL stays kept (not pinned); unpin removes it.
func TestPinPendingResumed(t *testing.T) {
	dir := t.TempDir()
	s, err := chunkstore.Open(chunkstore.Options{Dir: dir})
	require.NoError(t, err)
	defer s.Close()
	added := time.Unix(1700000000, 0).UTC()
	require.NoError(t, writePinRecord(dir, pinRecord{Version: 1, Pins: []pinRecordEntry{
		{Path: "m/kept", Added: added}, {Path: "m/half", Added: added, Pending: true}, {Path: "m/local", Added: added, Kept: true}}}))
	var logs bytes.Buffer
	np, err := startPins(s, "1MiB", slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err)
	np.close() // waits for the re-pins
	rec, err := readPinRecord(dir)
	require.NoError(t, err)
	require.Equal(t, []pinRecordEntry{{Path: "m/kept", Added: added}, {Path: "m/half", Added: added}, {Path: "m/local", Added: added, Kept: true}}, rec.Pins)
	require.Contains(t, np.pins, "m/kept")
	require.Contains(t, np.pins, "m/half")
	require.False(t, np.pins["m/half"].held())
	require.NotContains(t, np.pins, "m/local")
	require.Equal(t, []string{"m/local"}, np.status().Kept)
	require.Contains(t, logs.String(), "still fetching its chunks when the node stopped; it is resumed")
	require.NoError(t, np.keepLocal("m/other"))
	require.NoError(t, np.unpin("m/local"))
	rec, err = readPinRecord(dir)
	require.NoError(t, err)
	require.Len(t, rec.Pins, 3)
	require.Equal(t, "m/other", rec.Pins[2].Path)
	require.True(t, rec.Pins[2].Kept)
}

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

package node

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

func TestParsePinBudget(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "64MiB": 64 << 20, "2GiB": 2 << 30, "1g": 1 << 30} {
		got, err := ParsePinBudget(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	half, err := ParsePinBudget("50%")
	require.NoError(t, err)
	all, err := ParsePinBudget("100%")
	require.NoError(t, err)
	require.Greater(t, half, int64(0))
	require.InDelta(t, float64(all)/2, float64(half), 1)
	for _, bad := range []string{"", "abc", "150%", "-1%", "-5MiB"} {
		_, err := ParsePinBudget(bad)
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
	np, err := startPins(s, 1<<20, 0, slog.New(slog.NewTextHandler(&logs, nil)))
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

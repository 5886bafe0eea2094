package chunkstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLastRead: a read counts until the end of its day (UTC), a later day
// moves it, the days survive a reopen (flushed at Close), and a file never
// read has none.
func TestLastRead(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir)
	a, b := Sum([]byte("a")), Sum([]byte("b"))
	day := time.Date(2026, 12, 6, 15, 4, 5, 0, time.UTC)
	s.lastRead.now = func() time.Time { return day }
	_, ok := s.LastRead(a)
	require.False(t, ok)
	s.NoteRead(a)
	got, ok := s.LastRead(a)
	require.True(t, ok)
	require.Equal(t, time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC), got.UTC())

	day = day.Add(48 * time.Hour)
	s.NoteRead(a)
	s.NoteRead(b)
	require.NoError(t, s.Close())

	s = openTest(t, dir)
	got, ok = s.LastRead(a)
	require.True(t, ok)
	require.Equal(t, time.Date(2026, 12, 9, 0, 0, 0, 0, time.UTC), got.UTC(), "the later day, from the index")
	_, ok = s.LastRead(Sum([]byte("c")))
	require.False(t, ok)
}

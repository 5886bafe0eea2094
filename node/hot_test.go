package node

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/gpuio"
)

// hotFixture is a store with three 1 MiB files and node pins whose hot
// files are made by direct calls (no worker), with a clock and the memory
// available set by the test.
type hotFixture struct {
	s     *chunkstore.Store
	np    *nodePins
	ids   map[string]chunkstore.ID
	clock time.Time
	avail int64
}

func newHotFixture(t *testing.T, budget int64) *hotFixture {
	t.Helper()
	dir, src := t.TempDir(), t.TempDir()
	s, err := chunkstore.Open(chunkstore.Options{Dir: dir})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	f := &hotFixture{s: s, ids: map[string]chunkstore.ID{}, clock: time.Unix(1800000000, 0), avail: 1 << 40}
	rng := rand.New(rand.NewChaCha8([32]byte{7}))
	for _, name := range []string{"a", "b", "c"} {
		b := make([]byte, 1<<20)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		require.NoError(t, os.WriteFile(filepath.Join(src, name), b, 0o644))
		_, err := s.Import(context.Background(), filepath.Join(src, name), "m/"+name, chunkstore.ImportOptions{})
		require.NoError(t, err)
		file, _, err := s.OpenPath("m/" + name)
		require.NoError(t, err)
		f.ids[name] = file.ID
		f.warm(t, name)
	}
	f.np, err = startPins(s, 1<<30, 0, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(f.np.close)
	f.np.hot.budget = budget
	f.np.hot.floor = 1 << 30
	f.np.hot.now = func() time.Time { return f.clock }
	f.np.hot.memAvailable = func() (int64, error) { return f.avail, nil }
	return f
}

// warm reads the packs of file name into the page cache.
func (f *hotFixture) warm(t *testing.T, name string) {
	t.Helper()
	file, err := f.s.OpenFile(f.ids[name])
	require.NoError(t, err)
	for _, x := range file.Extents() {
		b, err := os.ReadFile(x.PackPath)
		require.NoError(t, err)
		require.NotEmpty(t, b)
	}
}

func (f *hotFixture) load(name string) {
	f.clock = f.clock.Add(time.Second)
	if f.np.hot.files[f.ids[name]] != nil {
		f.np.noteLoaded(func() string { return "m/" + name }, f.ids[name], 1<<20)
		return
	}
	f.np.makeHot(context.Background(), hotReq{path: "m/" + name, id: f.ids[name]})
}

func (f *hotFixture) hot() []string {
	var out []string
	for _, h := range f.np.hotStatus().Files {
		out = append(out, h.Path)
	}
	return out
}

// TestHotFilesLRU: hot files are released least recently loaded first when
// the budget is full, when memory available falls under the floor, and
// after hotIdle without a load; a load of a hot file counts as use.
func TestHotFilesLRU(t *testing.T) {
	f := newHotFixture(t, 2<<20+64<<10) // two files, not three
	f.load("a")
	f.load("b")
	require.Equal(t, []string{"m/b", "m/a"}, f.hot())
	f.load("a") // used: b is now the least recent
	f.load("c")
	require.Equal(t, []string{"m/c", "m/a"}, f.hot())
	st := f.np.hotStatus()
	require.Equal(t, map[string]int64{"budget": 1}, st.Evicted)
	require.Equal(t, int64(3), st.Made)
	require.Equal(t, f.np.host.Locked(), st.LockedBytes)

	// Short of memory: the least recent goes, until enough is available.
	f.avail = 1<<30 - 1
	released := 0
	f.np.hot.memAvailable = func() (int64, error) {
		if released++; released > 1 {
			return 1 << 30, nil // one release was enough
		}
		return f.avail, nil
	}
	f.np.trimHot()
	require.Equal(t, []string{"m/c"}, f.hot())
	require.Equal(t, int64(1), f.np.hotStatus().Evicted["memory"])

	// None is made that would take memory under the floor.
	f.np.hot.memAvailable = func() (int64, error) { return 1<<30 + 512<<10, nil }
	f.load("b")
	require.Equal(t, []string{"m/c"}, f.hot())
	require.Contains(t, f.np.hotStatus().LastSkip, "m/b: locking 1.0 MiB would leave")

	// Idle: released after hotIdle without a load.
	f.np.hot.memAvailable = func() (int64, error) { return 1 << 40, nil }
	f.clock = f.clock.Add(hotIdle)
	f.np.trimHot()
	require.Empty(t, f.hot())
	require.Equal(t, int64(1), f.np.hotStatus().Evicted["idle"])
	require.Zero(t, f.np.host.Locked())
}

// TestHotFileNotCached: a file whose packs are not in the page cache is not
// made hot (locking would read it from the disk), and last_skip says so.
func TestHotFileNotCached(t *testing.T) {
	f := newHotFixture(t, 64<<20)
	file, err := f.s.OpenFile(f.ids["a"])
	require.NoError(t, err)
	x := file.Extents()[0]
	pf, err := os.Open(x.PackPath)
	require.NoError(t, err)
	defer pf.Close()
	require.NoError(t, unix.Fadvise(int(pf.Fd()), 0, 0, unix.FADV_DONTNEED))
	if n, _ := gpuio.ResidentBytes(x.PackPath, x.PackOff, x.Len); n*100 >= x.Len*hotResidentPercent {
		t.Skip("the kernel kept the pack's pages cached after FADV_DONTNEED")
	}
	f.load("a")
	require.Empty(t, f.hot())
	require.Contains(t, f.np.hotStatus().LastSkip, "of its 1.0 MiB in the page cache")
	require.Zero(t, f.np.host.Locked())
}

// TestHotFileReplaced: when a new version of a path is made hot, the hot
// older version of that path is released (reason replaced).
func TestHotFileReplaced(t *testing.T) {
	f := newHotFixture(t, 64<<20)
	f.load("a")
	old := f.ids["a"]
	src := filepath.Join(t.TempDir(), "a2")
	b := make([]byte, 1<<20)
	rand.NewChaCha8([32]byte{8}).Read(b)
	require.NoError(t, os.WriteFile(src, b, 0o644))
	_, err := f.s.Import(context.Background(), src, "m/a", chunkstore.ImportOptions{})
	require.NoError(t, err)
	file, _, err := f.s.OpenPath("m/a")
	require.NoError(t, err)
	require.NotEqual(t, old, file.ID)
	f.ids["a"] = file.ID
	f.warm(t, "a")
	f.load("a")
	require.Equal(t, []string{"m/a"}, f.hot())
	st := f.np.hotStatus()
	require.Equal(t, int64(1), st.Evicted["replaced"])
	require.Nil(t, f.np.hot.files[old])
	require.NotNil(t, f.np.hot.files[file.ID])
}

// TestHotFilesBounded: a file under hotMinSize is not queued at all, and
// past the file cap the least recently loaded hot file goes.
func TestHotFilesBounded(t *testing.T) {
	f := newHotFixture(t, 64<<20)
	f.np.noteLoaded(func() string { return "m/a" }, f.ids["a"], hotMinSize-1)
	require.Empty(t, f.np.hot.queue, "a small file is not queued")
	f.np.hot.maxFiles = 2
	f.load("a")
	f.load("b")
	f.load("c")
	require.Equal(t, []string{"m/c", "m/b"}, f.hot())
	require.Equal(t, int64(1), f.np.hotStatus().Evicted["budget"])
}

package test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// shardSource writes a WebDataset-like tree: samples of a .jpg (random,
// 1-9 KiB) and a .cls beside it in three directories, an empty member, a
// name too long for ustar, and a symlink (which shards skip).
func shardSource(t *testing.T, samples int) string {
	t.Helper()
	src := filepath.Join(openTempDir(t), "src")
	r := rand.New(rand.NewPCG(7, 9))
	for i := 0; i < samples; i++ {
		dir := filepath.Join(src, fmt.Sprintf("part%d", i%3))
		require.NoError(t, os.MkdirAll(dir, 0o755))
		img := make([]byte, 1024+r.IntN(8*1024))
		for j := range img {
			img[j] = byte(r.Uint32())
		}
		key := filepath.Join(dir, fmt.Sprintf("%06d", i))
		require.NoError(t, os.WriteFile(key+".jpg", img, 0o644))
		require.NoError(t, os.WriteFile(key+".cls", []byte(fmt.Sprintf("%d\n", i%10)), 0o644))
	}
	long := filepath.Join(src, "part0", strings.Repeat("l", 150)+".txt")
	require.NoError(t, os.WriteFile(long, []byte("a member whose name needs PAX records\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(src, "part1", "empty.txt"), nil, 0o644))
	require.NoError(t, os.Symlink("part0", filepath.Join(src, "link")))
	return src
}

type shardsOut struct {
	Samples     int   `json:"samples"`
	Files       int   `json:"files"`
	MemberBytes int64 `json:"member_bytes"`
	TarBytes    int64 `json:"tar_bytes"`
	NewBytes    int64 `json:"new_bytes"`
	Shards      []struct {
		Name    string `json:"name"`
		Bytes   int64  `json:"bytes"`
		Samples int    `json:"samples"`
		Files   int    `json:"files"`
	} `json:"shards"`
}

func uniqueBytes(t *testing.T, data, path string) int64 {
	t.Helper()
	var u struct {
		UniqueBytes int64 `json:"unique_bytes"`
	}
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, "/", "du", "--data", data, "-s", "--json", path)), &u))
	return u.UniqueBytes
}

// TestShardsThroughMount: `kylix shards` of an imported tree of small
// files, read through the mount by GNU tar, gives back every file byte for
// byte; a sample's members are never split across shards; the shards
// add only their headers to the store (du); they outlive their source
// (rm + gc); and they are readable by exactly whom the mount lets read
// every member.
func TestShardsThroughMount(t *testing.T) {
	requireFUSE(t)
	base := openTempDir(t)
	data, mnt := filepath.Join(base, "data"), filepath.Join(base, "mnt")
	src := shardSource(t, 300)
	want := treeSums(t, src) // regular files only: the link is not a member
	startNode(t, data, mnt)
	mustKylix(t, "/", "import", "--data", data, "--no-dereference", src, "ds/d")
	out := mustKylix(t, "/", "shards", "--data", data, "--json", "--shard-size", "256KiB", "ds/d", "ds/d.shards")
	var res shardsOut
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	assert.Equal(t, 302, res.Samples, "300 samples, the long name and empty.txt")
	assert.Equal(t, len(want), res.Files)
	require.Greater(t, len(res.Shards), 4, "256 KiB shards of about 1.5 MiB")

	extract := func(dir string) map[string][]string {
		t.Helper()
		membersOf := map[string][]string{} // sample key -> shards holding it
		require.NoError(t, os.MkdirAll(dir, 0o755))
		for _, sh := range res.Shards {
			p := filepath.Join(mnt, "ds", "d.shards", sh.Name)
			st, err := os.Stat(p)
			require.NoError(t, err)
			assert.Equal(t, sh.Bytes, st.Size(), sh.Name)
			run(t, dir, "tar", "-xf", p)
			for _, name := range strings.Fields(run(t, dir, "tar", "-tf", p)) {
				b := filepath.Base(name)
				key := filepath.Join(filepath.Dir(name), strings.SplitN(b, ".", 2)[0])
				if l := membersOf[key]; len(l) == 0 || l[len(l)-1] != sh.Name {
					membersOf[key] = append(l, sh.Name)
				}
			}
		}
		return membersOf
	}
	x1 := filepath.Join(t.TempDir(), "x1")
	keys := extract(x1)
	assert.True(t, equalSums(treeSums(t, x1), want), "files extracted from the shards differ from the source")
	for k, l := range keys {
		assert.Len(t, l, 1, "sample %s split across shards %v", k, l)
	}
	var idx struct {
		Format string `json:"format"`
		Files  int    `json:"files"`
	}
	b, err := os.ReadFile(filepath.Join(mnt, "ds", "d.shards", "index.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &idx))
	assert.Equal(t, "kylix-tar-shards/1", idx.Format)
	assert.Equal(t, len(want), idx.Files)

	// No second copy: the store's distinct chunks grew by exactly what the
	// shards added (headers, padding, trailers, the index), which is
	// small beside the members.
	assert.Equal(t, uniqueBytes(t, data, "ds/d")+res.NewBytes, uniqueBytes(t, data, "ds"))
	assert.Less(t, res.NewBytes, int64(res.Files)*1024+int64(len(res.Shards))*1024+4096)
	assert.Less(t, res.NewBytes*4, res.MemberBytes, "headers should be a small part of the bytes")

	// The shards are a snapshot that holds its own chunks.
	mustKylix(t, "/", "rm", "--data", data, "-r", "ds/d")
	mustKylix(t, "/", "gc", "--data", data)
	x2 := filepath.Join(t.TempDir(), "x2")
	extract(x2)
	assert.True(t, equalSums(treeSums(t, x2), want), "shards differ after their source was removed and collected")

	// Readable by every class that may read every member: all 0644 under
	// 0755 directories gives 0444 shards that uid 65534 reads.
	st, err := os.Stat(filepath.Join(mnt, "ds", "d.shards", res.Shards[0].Name))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o444), st.Mode().Perm())
	asUser(t, base, 65534, 65534, nil, "cat "+filepath.Join(mnt, "ds", "d.shards", res.Shards[0].Name)+" > /dev/null")

	// One private member: shards readable by their owner only, refused to
	// uid 65534 as the member itself is.
	require.NoError(t, os.Chmod(filepath.Join(src, "part2", "000002.jpg"), 0o600))
	mustKylix(t, "/", "import", "--data", data, src, "ds/p")
	mustKylix(t, "/", "shards", "--data", data, "ds/p", "ds/p.shards")
	p := filepath.Join(mnt, "ds", "p.shards", "shard-000000.tar")
	st, err = os.Stat(p)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o400), st.Mode().Perm())
	cmd := exec.Command("cat", p)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	msg, err := cmd.CombinedOutput()
	assert.Error(t, err, "uid 65534 read a shard holding a 0600 member: %s", msg)
	assert.Contains(t, string(msg), "Permission denied")

	// Members of different owners are refused, naming the file.
	require.NoError(t, os.Chown(filepath.Join(src, "part0", "000000.cls"), 65534, 65534))
	mustKylix(t, "/", "import", "--data", data, src, "ds/o")
	_, errs, code := kylix(t, "/", "shards", "--data", data, "ds/o", "ds/o.shards")
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "part0/000000.cls is owned by 65534:65534")
	_, errs, code = kylix(t, "/", "shards", "--data", data, "ds/p", "ds/p/inside")
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "outside SRC")
	_, errs, code = kylix(t, "/", "shards", "--data", data, "--shard-size", "0", "ds/p", "ds/x")
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "--shard-size")
}

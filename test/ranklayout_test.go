package test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore/safetensors"
	"github.com/kylix/kylix/clientproto"
	"github.com/kylix/kylix/gpuio"
)

type rankLoad struct {
	Files []struct {
		Path       string `json:"path"`
		Bytes      int64  `json:"bytes"`
		Checked    bool   `json:"checked"`
		RankLayout string `json:"rank_layout"`
	} `json:"files"`
}

// loadRank runs kylix load --device host --check for one rank through the
// node and returns its report per safetensors file.
func loadRank(t *testing.T, data string, rank int, extra ...string) map[string]string {
	t.Helper()
	args := append([]string{"load", "--data", data, "--device", "host", "--tp-size", "2", "--tp-rank", strconv.Itoa(rank), "--check", "--json"}, extra...)
	var rep rankLoad
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, data, append(args, "m")...)), &rep))
	out := map[string]string{}
	for _, f := range rep.Files {
		require.True(t, f.Checked, "%s read back and compared", f.Path)
		if strings.HasSuffix(f.Path, ".safetensors") {
			out[filepath.Base(f.Path)] = f.RankLayout
		}
	}
	return out
}

func packNames(t *testing.T, data string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(data, "packs"))
	require.NoError(t, err)
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".pack") {
			out = append(out, filepath.Join(data, "packs", e.Name()))
		}
	}
	return out
}

// TestRankLayoutThroughNode: kylix layout stores a layout per rank through
// a running node; kylix load --tp-size reads each rank's shares from it
// (its report names it) and the bytes read back equal the file's shares
// (--check), as --no-layout's do. The layouts are not in the mount (no
// listing, no lookup, the name cannot be made); kylix du counts them; a
// file written over through the mount no longer uses its layouts and the
// next kylix gc removes them; a byte flipped in a layout's pack fails the
// load that reads it, never placing a wrong byte.
func TestRankLayoutThroughNode(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	models := t.TempDir()
	mustKylix(t, "/", "demo-model", "--size", "48MiB", models)
	mustKylix(t, "/", "import", "--data", data, filepath.Join(models, "base"), "m")
	before := packNames(t, data)
	launchNode(t, data, mnt, nil, nil, "--client-socket", "none")

	out := mustKylix(t, data, "layout", "--data", data, "--tp-size", "2", "m")
	require.Regexp(t, `m/model-00001-of-00002\.safetensors: tp 2, 2 ranks, \d+ strided tensors; layouts .*, new bytes stored`, out)
	require.Regexp(t, `total: layouts .*; 5 files not safetensors left alone`, out)
	layoutPacks := slices.DeleteFunc(packNames(t, data), func(p string) bool { return slices.Contains(before, p) })
	require.Regexp(t, `m/model-00002-of-00002\.safetensors: tp2-rank1 `, mustKylix(t, data, "layout", "--data", data, "m"))
	require.Contains(t, mustKylix(t, data, "stat", "--data", data, "m/model-00001-of-00002.safetensors"), "rank layout: tp2-rank1, ")
	for r := range 2 {
		got := loadRank(t, data, r)
		require.Len(t, got, 2)
		for name, rl := range got {
			require.Contains(t, rl, "tp2-rank"+strconv.Itoa(r), "%s read from its layout", name)
		}
		for name, rl := range loadRank(t, data, r, "--no-layout") {
			require.Empty(t, rl, name)
		}
	}

	// Pinned, the file's registered pages are read rather than the layout
	// (preferLayout); unpinned, the layout again.
	mustKylix(t, data, "pin", "--data", data, "m")
	for name, rl := range loadRank(t, data, 1) {
		require.Contains(t, rl, "not used: the file is held in memory", name)
	}
	mustKylix(t, data, "unpin", "--data", data, "m")
	for name, rl := range loadRank(t, data, 1) {
		require.Contains(t, rl, "tp2-rank1", name)
	}

	ents, err := os.ReadDir(mnt)
	require.NoError(t, err)
	for _, e := range ents {
		require.NotEqual(t, ".kylix-layouts", e.Name())
	}
	_, err = os.Stat(filepath.Join(mnt, ".kylix-layouts"))
	require.ErrorIs(t, err, os.ErrNotExist)
	require.Error(t, os.Mkdir(filepath.Join(mnt, ".kylix-layouts"), 0o755), "the name is reserved")
	_, stderr, code := kylix(t, data, "import", "--data", data, filepath.Join(models, "base", "config.json"), ".kylix-layouts/x")
	require.NotZero(t, code)
	require.Contains(t, stderr, "reserved")
	require.Regexp(t, `rank layouts \(the whole store, not in STORED\): 4 files, .* of chunks their files do not hold`, mustKylix(t, data, "du", "--data", data))

	// The second shard written over through the mount (the fine-tune's
	// holds the changed last layers): that file's layouts are not used,
	// and gc removes them.
	ft2 := filepath.Join(models, "finetuned", "model-00002-of-00002.safetensors")
	require.NotEqual(t, sha256sum(t, ft2), sha256sum(t, filepath.Join(models, "base", "model-00002-of-00002.safetensors")))
	b, err := os.ReadFile(ft2)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(mnt, "m", "model-00002-of-00002.safetensors"), b, 0o644))
	got := loadRank(t, data, 0)
	require.Contains(t, got["model-00001-of-00002.safetensors"], "tp2-rank0")
	require.Empty(t, got["model-00002-of-00002.safetensors"], "a new version has no layout")
	require.Contains(t, mustKylix(t, data, "gc", "--data", data), "removed 2 rank layouts of file versions no longer stored")

	// Damage every layout pack left (a byte per MiB): a load that reads
	// a damaged chunk fails; none places a wrong byte (--check).
	var damaged []string
	for _, p := range layoutPacks {
		st, err := os.Stat(p)
		if os.IsNotExist(err) {
			continue // the written-over file's layouts, collected
		}
		require.NoError(t, err)
		for off := int64(4096 + 777); off < st.Size(); off += 1 << 20 {
			damageAt(t, p, off)
		}
		damaged = append(damaged, p)
	}
	require.NotEmpty(t, damaged)
	failed := 0
	for r := range 2 {
		stdout, stderr, code := kylix(t, data, "load", "--data", data, "--device", "host", "--tp-size", "2", "--tp-rank", strconv.Itoa(r), "--check", "m")
		if code == 0 {
			require.Contains(t, stdout, "read back and compared")
			continue
		}
		failed++
		require.Regexp(t, `corrupt|does not match`, stderr)
		require.NotContains(t, stderr, "differ from the store")
	}
	require.Positive(t, failed, "the damaged layouts were read")
	// Dropped, the shares are read from the files again.
	require.Contains(t, mustKylix(t, data, "layout", "--data", data, "--drop", "m"), "rank layouts dropped")
	for r := range 2 {
		for name, rl := range loadRank(t, data, r) {
			require.Empty(t, rl, name)
		}
	}
}

// TestRankLayoutFill: a client's FILL of one rank's shares (strided ranges
// for the row-parallel tensors, as kylix.torch asks) through the client
// socket of a node with the stub CUDA driver: with layouts stored, the
// strided shares are read from the rank's layout (the reply's io says
// so), and the allocation holds exactly the shares the file gives; with
// the layouts dropped, the same bytes from the file.
func TestRankLayoutFill(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	models := t.TempDir()
	mustKylix(t, "/", "demo-model", "--size", "24MiB", models)
	// Layouts at import: here, then through the node.
	require.Regexp(t, `rank layouts: tp 2 for 2 files, .*, new bytes stored`, mustKylix(t, "/", "import", "--data", data, "--tp-size", "2", filepath.Join(models, "base"), "m"))
	n, sock := startStubGPUNode(t, data, mnt)
	require.Regexp(t, `rank layouts: tp 2 for 2 files, .*, new bytes stored 0 B`, mustKylix(t, data, "import", "--data", data, "--tp-size", "2", filepath.Join(models, "base"), "m2"))
	name := "model-00001-of-00002.safetensors"
	src, err := os.ReadFile(filepath.Join(models, "base", name))
	require.NoError(t, err)
	h, err := safetensors.ParseBytes(src, int64(len(src)))
	require.NoError(t, err)

	const rank, tp = 1, 2
	var ranges []clientproto.Range
	var want []byte
	strided := 0
	for _, tn := range h.Tensors {
		sl, err := gpuio.TPShare(tn, rank, tp).Layout(tn)
		require.NoError(t, err)
		if sl.Bytes == 0 {
			continue
		}
		off := uint64(h.DataStart() + tn.Begin + sl.ColOff)
		r := clientproto.Range{FileOffset: off, Length: uint64(sl.Bytes), DstOffset: uint64(len(want))}
		if sl.Rows > 1 && sl.Width < sl.Pitch {
			r.Length, r.Rows, r.Pitch = uint64(sl.Width), uint64(sl.Rows), uint64(sl.Pitch)
			strided++
		}
		ranges = append(ranges, r)
		for row := int64(0); row < sl.Rows; row++ {
			at := h.DataStart() + tn.Begin + row*sl.Pitch + sl.ColOff
			want = append(want, src[at:at+sl.Width]...)
		}
	}
	require.Positive(t, strided)
	c := dialClient(t, sock)
	f := openRO(t, filepath.Join(mnt, "m", name))
	fill := func() string {
		a := newShmAlloc(t, len(want))
		r := c.req(clientproto.OpFill, clientproto.FillRequest{IPCHandle: a.handle, Flags: clientproto.FillStrided, Ranges: ranges}.Append(nil), int(f.Fd()))
		require.Zero(t, r.status, "FILL: %s\n%s", r.msg, n.log)
		fr, err := clientproto.ParseFillReply(r.fields)
		require.NoError(t, err)
		require.Equal(t, uint64(len(want)), fr.Bytes)
		require.True(t, bytes.Equal(want, a.bytes(t)), "the allocation holds the rank's shares")
		return fr.IO
	}
	require.Contains(t, fill(), "rank layout")
	mustKylix(t, data, "layout", "--data", data, "--drop", "m")
	require.NotContains(t, fill(), "rank layout")
}

// TestRankLayoutKilled: the node killed with SIGKILL while kylix layout
// writes the layouts: the store verifies, holds no pack file its index
// does not know, and after a restart the layouts are made again and read.
func TestRankLayoutKilled(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	models := t.TempDir()
	mustKylix(t, "/", "demo-model", "--size", "256MiB", models)
	mustKylix(t, "/", "import", "--data", data, filepath.Join(models, "base"), "m")
	before := len(packNames(t, data))
	n := launchNode(t, data, mnt, nil, nil, "--client-socket", "none")
	cmd := exec.Command(kylixBin, "layout", "--data", data, "--tp-size", "2", "m")
	require.NoError(t, cmd.Start())
	waitFor(t, 30*time.Second, "a layout pack being written", func() bool { return len(packNames(t, data)) > before })
	n.kill9()
	_ = cmd.Wait() // its node is gone: it fails, or it finished first
	clearStaleMount(t, mnt)
	out := mustKylix(t, data, "verify", "--data", data)
	t.Logf("kylix verify after SIGKILL: %s", out)
	var d struct {
		Packs int `json:"packs"`
	}
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, data, "df", "--json", "--data", data)), &d))
	require.Equal(t, d.Packs, len(packNames(t, data)), "a pack file the index does not know was left")

	launchNode(t, data, mnt, nil, nil, "--client-socket", "none")
	mustKylix(t, data, "layout", "--data", data, "--tp-size", "2", "m")
	for r := range 2 {
		for name, rl := range loadRank(t, data, r) {
			require.Contains(t, rl, "tp2-rank"+strconv.Itoa(r), name)
		}
	}
	mustKylix(t, data, "gc", "--data", data)
	require.Regexp(t, `verified 11 files, .*\nok`, mustKylix(t, data, "verify", "--data", data), "the 7 files and their 4 layouts")
}

// TestRankLayoutAcrossMembers: layouts made on member A at import reach
// member B with the namespace merge (hidden in both mounts). B does not
// use a layout it did not make (a member could publish one whose bytes
// are not the shares: chunkstore's layoutsMade): its loads read the file
// and say why. Once B made them too (kylix layout on B: the same bytes,
// gathered there from the source's chunks fetched from A and verified),
// B loads each rank's shares from them; every byte placed is compared
// with the file's shares.
func TestRankLayoutAcrossMembers(t *testing.T) {
	requireFUSE(t)
	key := clusterKey(t)
	a := startMember(t, "127.0.0.92", key, nil)
	b := startMemberArgs(t, "127.0.0.93", key, nil, []string{"--role", "reader"}, a.addr)
	waitFor(t, membershipWait, "two alive members seen by B", func() bool { return aliveCount(t, b) == 2 })
	models := t.TempDir()
	mustKylix(t, "/", "demo-model", "--size", "24MiB", models)
	mustKylix(t, "/", "import", "--data", a.data, "--tp-size", "2", filepath.Join(models, "base"), "m")
	waitFor(t, nsWait, "the model in B's mount", visible(filepath.Join(b.mnt, "m", "model-00002-of-00002.safetensors")))
	waitFor(t, nsWait, "the layouts on B", func() bool {
		out, _, code := kylix(t, "/", "layout", "--data", b.data, "m")
		return code == 0 && strings.Count(out, "tp2-rank") == 4
	})
	_, err := os.Stat(filepath.Join(b.mnt, ".kylix-layouts"))
	require.ErrorIs(t, err, os.ErrNotExist)
	require.Contains(t, mustKylix(t, "/", "layout", "--data", b.data, "m"), "made on another member")
	for r := range 2 {
		out := mustKylix(t, "/", "load", "--data", b.data, "--device", "host", "--tp-size", "2", "--tp-rank", strconv.Itoa(r), "--check", "--json", "m")
		var rep rankLoad
		require.NoError(t, json.Unmarshal([]byte(out), &rep))
		for _, f := range rep.Files {
			require.True(t, f.Checked, f.Path)
			if strings.HasSuffix(f.Path, ".safetensors") {
				require.Contains(t, f.RankLayout, "not used: rank layout tp2-rank"+strconv.Itoa(r)+" was made on another member", f.Path)
			}
		}
	}
	// Made on B from the source's chunks, fetched from A and verified.
	require.Regexp(t, `model-00002-of-00002\.safetensors: tp 2, 2 ranks`, mustKylix(t, "/", "layout", "--data", b.data, "--tp-size", "2", "m"))
	require.NotContains(t, mustKylix(t, "/", "layout", "--data", b.data, "m"), "made on another member")
	for r := range 2 {
		var rep rankLoad
		out := mustKylix(t, "/", "load", "--data", b.data, "--device", "host", "--tp-size", "2", "--tp-rank", strconv.Itoa(r), "--check", "--json", "m")
		require.NoError(t, json.Unmarshal([]byte(out), &rep))
		for _, f := range rep.Files {
			require.True(t, f.Checked, f.Path)
			if strings.HasSuffix(f.Path, ".safetensors") {
				require.Contains(t, f.RankLayout, "tp2-rank"+strconv.Itoa(r), f.Path)
			}
		}
	}
}

package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/clientproto"
	"github.com/kylix/kylix/internal/damage"
)

// freeAddr returns a loopback address with a port nobody listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// metrics scrapes a node's /metrics and returns each series' value, keyed
// name{label="value",...} as the text format writes it.
func metrics(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	out := map[string]float64{}
	for name, mf := range fams {
		for _, m := range mf.GetMetric() {
			key := name
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[key] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[key] = m.GetGauge().GetValue()
			case dto.MetricType_UNTYPED:
				out[key] = m.GetUntyped().GetValue()
			}
		}
	}
	return out
}

// TestMetricsThroughMount: a node started with --metrics on a free port
// counts, as seen by scraping /metrics, exactly the bytes a read through
// the mount, an import and an export moved, and a corrupt chunk met by a
// read. No metric names a path.
func TestMetricsThroughMount(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	addr := freeAddr(t)
	url := "http://" + addr + "/metrics"
	up := func() bool {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	}
	// Every file served by the node, so that reads reach it.
	n := launchNode(t, data, mnt, nil, up, "--no-passthrough", "--client-socket", "none", "--metrics", addr)
	killOnFailure(t, n)

	src := t.TempDir()
	r := rand.NewChaCha8([32]byte{10})
	good := make([]byte, 3<<20+12345)
	r.Read(good)
	bad := make([]byte, 1<<20+77)
	r.Read(bad)
	require.NoError(t, os.WriteFile(filepath.Join(src, "good.bin"), good, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(src, "bad.bin"), bad, 0o644))

	m0 := metrics(t, url)
	mustKylix(t, "/", "import", "--data", data, filepath.Join(src, "good.bin"), "secret-name/good.bin")
	mustKylix(t, "/", "import", "--data", data, filepath.Join(src, "bad.bin"), "secret-name/bad.bin")
	m1 := metrics(t, url)
	assert.Equal(t, float64(len(good)+len(bad)), m1["kylix_import_bytes_total"]-m0["kylix_import_bytes_total"], "import bytes")

	expectSame(t, mnt, "secret-name/good.bin", good)
	var m2 map[string]float64
	// The kernel releases the file after cat exits.
	waitFor(t, 10*time.Second, "the open file to be released", func() bool {
		m2 = metrics(t, url)
		return m2["kylix_fs_open_files"] == 0
	})
	assert.Equal(t, float64(len(good)), m2["kylix_fs_node_read_bytes_total"]-m1["kylix_fs_node_read_bytes_total"], "bytes the node served to reads")
	assert.Positive(t, m2["kylix_fs_node_reads_total"]-m1["kylix_fs_node_reads_total"])
	assert.Equal(t, 1.0, m2[`kylix_fs_opens_total{path="node"}`]-m1[`kylix_fs_opens_total{path="node"}`], "opens served by the node")
	assert.Equal(t, 0.0, m2[`kylix_fs_opens_total{path="passthrough"}`], "passthrough opens with --no-passthrough")
	misses := m2["kylix_chunk_cache_misses_total"] - m1["kylix_chunk_cache_misses_total"]
	t.Logf("read %d bytes: the node served %.0f bytes in %.0f reads, %.0f chunk cache misses", len(good),
		m2["kylix_fs_node_read_bytes_total"]-m1["kylix_fs_node_read_bytes_total"], m2["kylix_fs_node_reads_total"]-m1["kylix_fs_node_reads_total"], misses)
	assert.Positive(t, misses, "chunks read from storage")

	// An export of the file just read finds its chunks in the chunk cache
	// (3 MiB fit in the default cache): hits, and no new misses.
	out := t.TempDir()
	mustKylix(t, "/", "export", "--data", data, "secret-name/good.bin", filepath.Join(out, "good.bin"))
	m3 := metrics(t, url)
	assert.Equal(t, float64(len(good)), m3["kylix_export_bytes_total"]-m2["kylix_export_bytes_total"], "export bytes")
	assert.Positive(t, m3["kylix_chunk_cache_hits_total"]-m2["kylix_chunk_cache_hits_total"], "the export found the chunks the read cached")
	assert.Equal(t, m2["kylix_chunk_cache_misses_total"], m3["kylix_chunk_cache_misses_total"], "no chunk read from storage twice")

	// A flipped byte in bad.bin's pack, never read before (not cached).
	ext := extentsOf(t, data, "secret-name/bad.bin")
	require.NotEmpty(t, ext)
	damage.FlipByte(t, ext[0].PackPath, ext[0].PackOff+ext[0].Len/2)
	expectEIO(t, mnt, "secret-name/bad.bin")
	m4 := metrics(t, url)
	assert.GreaterOrEqual(t, m4[`kylix_chunk_errors_total{kind="corrupt"}`]-m3[`kylix_chunk_errors_total{kind="corrupt"}`], 1.0, "corrupt chunks")
	for _, kind := range []string{"read_error", "not_local", "other"} {
		k := `kylix_chunk_errors_total{kind="` + kind + `"}`
		assert.Equal(t, 0.0, m4[k], k)
	}

	// Process and Go metrics are there; no series names a file.
	assert.Contains(t, m4, "process_resident_memory_bytes")
	assert.Contains(t, m4, "go_goroutines")
	resp, err := http.Get(url)
	require.NoError(t, err)
	var body bytes.Buffer
	body.ReadFrom(resp.Body)
	resp.Body.Close()
	assert.NotContains(t, body.String(), "secret-name")
	assert.NotContains(t, body.String(), mnt)

	n.stop()
	assert.Contains(t, n.log.String(), "metrics: "+url, "the node prints where it serves metrics")
}

// TestTopJSON: kylix top through the admin socket and through --url prints
// one line per interval, --count of them.
func TestTopJSON(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	addr := freeAddr(t)
	launchNode(t, data, mnt, nil, nil, "--client-socket", "none", "--metrics", addr)

	type line struct {
		Time            time.Time          `json:"time"`
		IntervalSeconds float64            `json:"interval_seconds"`
		Columns         map[string]float64 `json:"columns"`
		Metrics         map[string]float64 `json:"metrics"`
	}
	for _, args := range [][]string{
		{"top", "--data", data},
		{"stats", "--url", "http://" + addr + "/metrics"},
		{"top", "--url", addr}, // HOST:PORT
	} {
		out := mustKylix(t, "/", append(args, "--count", "2", "--interval", "200ms", "--json")...)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 2, "%v: %s", args, out)
		for _, l := range lines {
			var v line
			require.NoError(t, json.Unmarshal([]byte(l), &v), l)
			assert.False(t, v.Time.IsZero())
			assert.InDelta(t, 0.2, v.IntervalSeconds, 0.15)
			for _, k := range []string{"cpu_percent", "resident_bytes", "opens_per_second", "open_files", "node_read_bytes_per_second",
				"passthrough_open_bytes_per_second", "cache_hit_percent", "cache_misses_per_second", "chunk_errors_per_second",
				"client_requests_per_second", "gpu_fill_bytes_per_second", "import_bytes_per_second", "export_bytes_per_second"} {
				assert.Contains(t, v.Columns, k)
			}
			assert.Positive(t, v.Columns["resident_bytes"])
			assert.Contains(t, v.Metrics, "kylix_fs_node_read_bytes_total")
			assert.Contains(t, v.Metrics, `kylix_chunk_errors_total{kind="corrupt"}`)
		}
	}
	// Plain lines when stdout is not a terminal: the header, then one line.
	out := mustKylix(t, "/", "top", "--data", data, "--count", "1", "--interval", "100ms")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out)
	assert.Contains(t, lines[0], "mount")
	assert.Contains(t, lines[1], "hit%")
	assert.Len(t, strings.Fields(lines[2]), len(strings.Fields(lines[1])))

	// Without a node there is nothing to show.
	_, errs, code := kylix(t, "/", "top", "--data", t.TempDir(), "--count", "1")
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "no node serves")
}

type duUsage struct {
	Path     string    `json:"path"`
	Logical  int64     `json:"logical_bytes"`
	Unique   int64     `json:"unique_bytes"`
	Stored   int64     `json:"stored_bytes"`
	Files    int64     `json:"files"`
	Chunks   int64     `json:"chunks"`
	Children []duUsage `json:"children"`
}

// TestDuDedup: du of two versions of a model that share most chunks (kylix
// demo-model base and finetuned): logical bytes are the files' sizes, unique
// bytes count shared chunks once, so the parent's unique bytes are the
// base's plus what the fine-tune's import stored new; the same answer
// without and with a running node.
func TestDuDedup(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	model := demoModel(t, "32MiB")
	size := func(dir string) (n int64) {
		filepath.WalkDir(dir, func(_ string, d fs.DirEntry, _ error) error {
			if d.Type().IsRegular() {
				fi, _ := d.Info()
				n += fi.Size()
			}
			return nil
		})
		return n
	}
	var imp struct {
		NewBytes int64 `json:"new_bytes"`
	}
	mustKylix(t, "/", "import", "--data", data, filepath.Join(model, "base"), "models/base")
	out := mustKylix(t, "/", "import", "--data", data, "--json", filepath.Join(model, "finetuned"), "models/ft")
	require.NoError(t, json.Unmarshal([]byte(out), &imp), out)

	du := func() duUsage {
		var u duUsage
		out := mustKylix(t, "/", "du", "--data", data, "--json", "models")
		require.NoError(t, json.Unmarshal([]byte(out), &u), out)
		return u
	}
	u := du()
	require.Len(t, u.Children, 2)
	base, ft := u.Children[0], u.Children[1]
	assert.Equal(t, "models/base", base.Path)
	assert.Equal(t, "models/ft", ft.Path)
	assert.Equal(t, size(filepath.Join(model, "base")), base.Logical)
	assert.Equal(t, size(filepath.Join(model, "finetuned")), ft.Logical)
	assert.Equal(t, base.Logical+ft.Logical, u.Logical)
	assert.Equal(t, int64(14), u.Files)
	assert.Equal(t, base.Unique+imp.NewBytes, u.Unique, "the parent counts shared chunks once")
	assert.Less(t, imp.NewBytes*5, ft.Logical, "the fine-tune shares most chunks (demo-model)")
	for _, x := range []duUsage{u, base, ft} {
		assert.GreaterOrEqual(t, x.Stored, x.Unique, x.Path)
		// Each chunk's span rounded out to 4 KiB blocks at most.
		assert.LessOrEqual(t, x.Stored, x.Unique+x.Chunks*2*4096, x.Path)
	}
	// The whole store: unique bytes as df counts them.
	var df struct {
		Unique int64 `json:"unique_bytes"`
	}
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, "/", "df", "--data", data, "--json")), &df))
	var root duUsage
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, "/", "du", "--data", data, "--json", "-s")), &root))
	assert.Equal(t, df.Unique, root.Unique)
	assert.Empty(t, root.Children, "-s: no per-child figures")

	// Text: one line per child and the total, like du.
	text := mustKylix(t, "/", "du", "--data", data, "models")
	lines := strings.Split(strings.TrimSpace(text), "\n")
	require.Len(t, lines, 4, text)
	assert.True(t, strings.HasSuffix(lines[3], "/models"), lines[3])

	// With a node the command is answered by the node: the same figures.
	launchNode(t, data, mnt, nil, nil, "--client-socket", "none")
	assert.Equal(t, u, du())
}

// TestMetricsClientSocket: what the client socket hands out is counted:
// a passthrough open (the file's size), a pack fd (the pack's size), a GPU
// fill by the I/O path it took (the stub CUDA driver), requests and
// refusals.
func TestMetricsClientSocket(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	want := randomBytes(6<<20+123, 43)
	importFiles(t, data, map[string][]byte{"big": want})
	addr := freeAddr(t)
	url := "http://" + addr + "/metrics"
	_, sock := startStubGPUNode(t, data, mnt, "--metrics", addr)
	c := dialClient(t, sock)
	m0 := metrics(t, url)

	f := openRO(t, filepath.Join(mnt, "m/big"))
	m1 := metrics(t, url)
	assert.Equal(t, 1.0, m1[`kylix_fs_opens_total{path="passthrough"}`]-m0[`kylix_fs_opens_total{path="passthrough"}`], "passthrough opens")
	assert.Equal(t, float64(len(want)), m1["kylix_fs_passthrough_open_bytes_total"]-m0["kylix_fs_passthrough_open_bytes_total"])
	assert.Equal(t, 1.0, m1["kylix_fs_open_files"])
	assert.Equal(t, 1.0, m1["kylix_client_connections"])

	r := c.req(clientproto.OpPacks, nil, int(f.Fd()))
	require.Equal(t, int32(0), r.status, r.msg)
	r.close()
	a := newShmAlloc(t, 8<<20)
	r = c.req(clientproto.OpFill, fillReq(a, 0, 0, uint64(len(want))), int(f.Fd()))
	require.Equal(t, int32(0), r.status, r.msg)
	fr, err := clientproto.ParseFillReply(r.fields)
	require.NoError(t, err)
	r = c.req(clientproto.OpFill, fillReq(a, 8<<20-10, 0, 4096), int(f.Fd())) // past the allocation
	require.NotEqual(t, int32(0), r.status)

	m2 := metrics(t, url)
	assert.Equal(t, 3.0, m2["kylix_client_requests_total"]-m1["kylix_client_requests_total"])
	assert.Equal(t, 1.0, m2["kylix_client_requests_refused_total"]-m1["kylix_client_requests_refused_total"])
	assert.Equal(t, 1.0, m2["kylix_client_pack_fds_total"]-m1["kylix_client_pack_fds_total"])
	assert.Equal(t, float64(len(want)), m2["kylix_client_pack_fd_bytes_total"]-m1["kylix_client_pack_fd_bytes_total"])
	path := `{io_path="` + fr.Path + `"}`
	assert.Equal(t, 1.0, m2["kylix_gpu_fills_total"+path], "fills on path %s", fr.Path)
	assert.Equal(t, float64(len(want)), m2["kylix_gpu_fill_bytes_total"+path], "fill bytes on path %s", fr.Path)
	assert.Equal(t, 0.0, m2[`kylix_gpu_fill_errors_total{kind="corrupt"}`])

	// A flipped byte in the pack: the fill fails, and says why.
	ext := extentsOf(t, data, "m/big")
	require.NotEmpty(t, ext)
	damage.FlipByte(t, ext[0].PackPath, ext[0].PackOff+ext[0].Len/2)
	r = c.req(clientproto.OpFill, fillReq(a, 0, 0, uint64(len(want))), int(f.Fd()))
	require.NotEqual(t, int32(0), r.status, "a fill of a corrupt chunk")
	m3 := metrics(t, url)
	assert.Equal(t, 1.0, m3[`kylix_gpu_fill_errors_total{kind="corrupt"}`], r.msg)
	assert.Equal(t, 1.0, m3["kylix_gpu_fills_total"+path], "failed fills are not counted as fills")
}

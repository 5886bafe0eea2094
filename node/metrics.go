package node

// The node's Prometheus metrics (docs/design/metrics.md). The counters live
// where the work is done (chunkstore.Counters, fs.Stats, the client
// socket's counters); nodeCollector reads them at scrape time, so nothing
// is counted twice. Every node keeps a registry, which `kylix top` reads
// through the admin socket; --metrics also serves it over HTTP.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"

	"github.com/kylix/kylix/chunkstore"
	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/internal/connlimit"
)

// The metrics server's limits (docs/design/metrics.md, "Limits"): anyone
// who can reach --metrics can connect, so its connections are few and
// short. A scrape is one request on one connection (Prometheus keeps it
// alive between scrapes, 15 s or more apart: it dials again, which costs
// nothing). Connections over a cap are closed at once.
const (
	metricsConnsPerAddr = 8
	metricsConns        = 32 // all addresses (at most a quarter of RLIMIT_NOFILE)
	metricsReadTimeout  = 10 * time.Second
	metricsWriteTimeout = 30 * time.Second
	metricsIdleTimeout  = 5 * time.Second
)

func metricsCaps() (perAddr, total int) {
	n := connlimit.NoFile()
	return min(metricsConnsPerAddr, connlimit.PerPeer(n, metricsConnsPerAddr)), min(metricsConns, connlimit.Share(n))
}

// nodeMetrics is a node's registry and, with --metrics, its HTTP server.
type nodeMetrics struct {
	reg  *prometheus.Registry
	srv  *http.Server
	addr string // the address bound, "" without --metrics
	done chan struct{}
}

// startMetrics makes the node's registry and, when addr is not empty,
// listens there. client may be nil (no client socket).
func startMetrics(addr string, s *chunkstore.Store, fsys *kfs.FS, client *clientServer, log *slog.Logger) (*nodeMetrics, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&nodeCollector{s: s, fsys: fsys, client: client},
	)
	m := &nodeMetrics{reg: reg}
	if addr == "" {
		return m, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("serve: --metrics %s: %w (choose another address, e.g. 127.0.0.1:9477)", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		Registry: reg, // promhttp_metric_handler_* about the handler itself
	}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, "kylix node: metrics at /metrics")
	})
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: metricsReadTimeout, ReadTimeout: metricsReadTimeout,
		WriteTimeout: metricsWriteTimeout, IdleTimeout: metricsIdleTimeout,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	m.addr = ln.Addr().String()
	refusedLog := &connlimit.Every{Period: 10 * time.Second}
	lim := &connlimit.Listener{Listener: ln, Limits: connlimit.New(metricsCaps), OnRefuse: func(c net.Conn) {
		if refusedLog.Allow() {
			log.Warn("metrics: too many connections; closing new ones at once", "remote", c.RemoteAddr().String())
		}
	}}
	m.done = make(chan struct{})
	go func() {
		defer close(m.done)
		if err := m.srv.Serve(lim); !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "addr", m.addr, "err", err)
		}
	}()
	log.Info("serving metrics", "url", m.url())
	return m, nil
}

func (m *nodeMetrics) url() string {
	if m == nil || m.addr == "" {
		return ""
	}
	return "http://" + m.addr + "/metrics"
}

// text is the registry in the Prometheus text format (kylix top reads
// it through the admin socket).
func (m *nodeMetrics) text() (string, error) {
	fams, err := m.reg.Gather()
	if err != nil {
		return "", fmt.Errorf("metrics: %w", err)
	}
	var b strings.Builder
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range fams {
		if err := enc.Encode(f); err != nil {
			return "", fmt.Errorf("metrics: %w", err)
		}
	}
	return b.String(), nil
}

// close stops the HTTP server (a scrape in progress may finish).
func (m *nodeMetrics) close() {
	if m == nil || m.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if m.srv.Shutdown(ctx) != nil {
		m.srv.Close()
	}
	<-m.done
}

// labeledCounts counts events and bytes by a label value (GPU fills by
// I/O path), for counters that had none to reuse.
type labeledCounts struct {
	mu sync.Mutex
	m  map[string][2]int64 // label -> {events, bytes}
}

func (l *labeledCounts) add(label string, bytes int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string][2]int64{}
	}
	v := l.m[label]
	l.m[label] = [2]int64{v[0] + 1, v[1] + bytes}
}

func (l *labeledCounts) snapshot() map[string][2]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string][2]int64, len(l.m))
	for k, v := range l.m {
		out[k] = v
	}
	return out
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc("kylix_"+name, help, labels, nil)
}

// The metrics' names and help: docs/design/metrics.md has the table.
var (
	mFSOpens        = desc("fs_opens_total", "Files opened for reading or writing in the mount, by who serves the reads: passthrough (the kernel reads the pack) or node.", "path")
	mFSPTRefused    = desc("fs_passthrough_refused_total", "Opens of a file with a whole-file pack that the node served instead (the pack failed its check).")
	mFSPTOpenBytes  = desc("fs_passthrough_open_bytes_total", "Sizes of the files opened by FUSE passthrough, added up; the kernel reads them without the node, so the bytes actually read are not known.")
	mFSReads        = desc("fs_node_reads_total", "FUSE read requests the node served.")
	mFSReadBytes    = desc("fs_node_read_bytes_total", "Bytes the node returned to FUSE reads (files not served by passthrough).")
	mFSOpenFiles    = desc("fs_open_files", "Files open in the mount now (handles the kernel has not released).")
	mFSCommits      = desc("fs_commits_total", "File versions written through the mount and committed.")
	mFSBatches      = desc("fs_commit_batches_total", "Commit batches (one index transaction each).")
	mCacheHits      = desc("chunk_cache_hits_total", "Chunk lookups answered without a storage read (cached, or a read in flight shared).")
	mCacheMisses    = desc("chunk_cache_misses_total", "Chunk lookups that read the chunk from storage.")
	mChunkErrors    = desc("chunk_errors_total", "Failed chunk reads, one per attempt, by kind: corrupt (hash mismatch, short pack), read_error (I/O error), not_local, other.", "kind")
	mPackChecks     = desc("pack_checks_total", "Whole-pack checks before passthrough opens or pack fds are handed out, by result.", "result")
	mPackCheckBytes = desc("pack_check_bytes_total", "Bytes hashed by the pack checks before passthrough.")
	mScrubPasses    = desc("scrub_passes_total", "Completed passes of the background scrub of passthrough packs.")
	mScrubBytes     = desc("scrub_bytes_total", "Bytes the background scrub hashed.")
	mScrubFailed    = desc("scrub_failed_packs_total", "Packs the background scrub found bad.")
	mImportBytes    = desc("import_bytes_total", "Bytes read from sources by kylix import run in this node.")
	mExportBytes    = desc("export_bytes_total", "Bytes written by kylix export run in this node.")
	mClientConns    = desc("client_connections", "Connections to the client socket now.")
	mClientAccepted = desc("client_connections_total", "Connections accepted on the client socket.")
	mClientRequests = desc("client_requests_total", "Requests on the client socket.")
	mClientRefused  = desc("client_requests_refused_total", "Requests on the client socket answered with an error.")
	mClientConnsRef = desc("client_connections_refused_total", "Connections to the client socket closed at once: their uid held its cap.")
	mClientPackFds  = desc("client_pack_fds_total", "Verified whole-file pack fds handed to clients (libkylix reads them itself).")
	mClientPackByte = desc("client_pack_fd_bytes_total", "Sizes of the pack fds handed to clients, added up; the client reads them without the node.")
	mGPUFills       = desc("gpu_fills_total", "GPU fills for clients, by the I/O path they took.", "io_path")
	mGPUFillBytes   = desc("gpu_fill_bytes_total", "Bytes written into clients' GPU memory, by the I/O path taken.", "io_path")
	mGPUFillErrors  = desc("gpu_fill_errors_total", "GPU fills that failed after they started, by the chunk failure met: corrupt, read_error, not_local, other (CUDA and the rest).", "kind")
)

// nodeCollector reads the node's counters at each scrape.
type nodeCollector struct {
	s      *chunkstore.Store
	fsys   *kfs.FS
	client *clientServer // nil: no client socket
}

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{mFSOpens, mFSPTRefused, mFSPTOpenBytes, mFSReads, mFSReadBytes, mFSOpenFiles,
		mFSCommits, mFSBatches, mCacheHits, mCacheMisses, mChunkErrors, mPackChecks, mPackCheckBytes, mScrubPasses,
		mScrubBytes, mScrubFailed, mImportBytes, mExportBytes, mClientConns, mClientAccepted, mClientRequests,
		mClientRefused, mClientConnsRef, mClientPackFds, mClientPackByte, mGPUFills, mGPUFillBytes, mGPUFillErrors} {
		ch <- d
	}
}

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	fst := c.fsys.Stats()
	counter(mFSOpens, fst.PassthroughOpens, "passthrough")
	counter(mFSOpens, fst.DaemonOpens, "node")
	counter(mFSPTRefused, fst.PassthroughRefused)
	counter(mFSPTOpenBytes, fst.PassthroughOpenBytes)
	counter(mFSReads, fst.DaemonReads)
	counter(mFSReadBytes, fst.DaemonReadBytes)
	gauge(mFSOpenFiles, fst.OpenFiles)
	counter(mFSCommits, fst.Commits)
	counter(mFSBatches, fst.CommitBatches)

	sc := c.s.Counters()
	counter(mCacheHits, sc.CacheHits)
	counter(mCacheMisses, sc.CacheMisses)
	counter(mChunkErrors, sc.ChunkCorrupt, chunkstore.KindCorrupt)
	counter(mChunkErrors, sc.ChunkReadError, chunkstore.KindReadError)
	counter(mChunkErrors, sc.ChunkNotLocal, chunkstore.KindNotLocal)
	counter(mChunkErrors, sc.ChunkOther, chunkstore.KindOther)
	counter(mImportBytes, sc.ImportBytes)
	counter(mExportBytes, sc.ExportBytes)

	pc := c.s.PackVerifyStats()
	counter(mPackChecks, pc.Verified, "passed")
	counter(mPackChecks, pc.Failed, "failed")
	counter(mPackCheckBytes, pc.Bytes)
	counter(mScrubPasses, pc.ScrubPasses)
	counter(mScrubBytes, pc.ScrubBytes)
	counter(mScrubFailed, pc.ScrubFailed)

	if c.client == nil {
		return
	}
	cl := c.client
	gauge(mClientConns, cl.connected.Load())
	counter(mClientAccepted, cl.accepted.Load())
	counter(mClientRequests, cl.requests.Load())
	counter(mClientRefused, cl.refused.Load())
	counter(mClientConnsRef, cl.refusedConns.Load())
	counter(mClientPackFds, cl.packFds.Load())
	counter(mClientPackByte, cl.packFdBytes.Load())
	paths := cl.fillPaths.snapshot()
	names := make([]string, 0, len(paths))
	for p := range paths {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		counter(mGPUFills, paths[p][0], p)
		counter(mGPUFillBytes, paths[p][1], p)
	}
	fails := cl.fillFailures.snapshot()
	for _, kind := range []string{chunkstore.KindCorrupt, chunkstore.KindReadError, chunkstore.KindNotLocal, chunkstore.KindOther} {
		counter(mGPUFillErrors, fails[kind][0], kind)
	}
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kylix/kylix/node"
)

func init() {
	register(&command{name: "top", summary: "show the running node's activity live, one line per second (alias: stats)", run: runTop})
	register(&command{name: "stats", summary: "same as top", run: func(ctx context.Context, e *env, args []string) error {
		return runTopAs(ctx, e, "stats", args)
	}})
}

// topColumn is one column of kylix top: a rate per second over the
// interval, or a gauge's value now.
type topColumn struct {
	group, name, key string
	bytes            bool                                       // shown in binary units
	value            func(prev, cur sample, dt float64) float64 // dt in seconds
}

// sample is one scrape: each series' value, and each metric's values
// added up over its labels.
type sample struct {
	series map[string]float64
	byName map[string]float64
}

func rate(name string) func(prev, cur sample, dt float64) float64 {
	return func(prev, cur sample, dt float64) float64 {
		return max(0, cur.byName[name]-prev.byName[name]) / dt
	}
}

// rateOf is rate of one series (a metric with its labels, as
// flatten keys it).
func rateOf(series string) func(prev, cur sample, dt float64) float64 {
	return func(prev, cur sample, dt float64) float64 {
		return max(0, cur.series[series]-prev.series[series]) / dt
	}
}

func now(name string) func(prev, cur sample, dt float64) float64 {
	return func(_, cur sample, _ float64) float64 { return cur.byName[name] }
}

// topColumns are kylix top's columns; key names the field in --json.
var topColumns = []topColumn{
	{"usage", "cpu%", "cpu_percent", false, func(p, c sample, dt float64) float64 {
		return 100 * max(0, c.byName["process_cpu_seconds_total"]-p.byName["process_cpu_seconds_total"]) / dt
	}},
	{"usage", "mem", "resident_bytes", true, now("process_resident_memory_bytes")},
	{"mount", "open/s", "opens_per_second", false, rate("kylix_fs_opens_total")},
	{"mount", "files", "open_files", false, now("kylix_fs_open_files")},
	{"mount", "node", "node_read_bytes_per_second", true, rate("kylix_fs_node_read_bytes_total")},
	{"mount", "pt", "passthrough_open_bytes_per_second", true, rate("kylix_fs_passthrough_open_bytes_total")},
	{"cache", "hit%", "cache_hit_percent", false, func(p, c sample, _ float64) float64 {
		h := c.byName["kylix_chunk_cache_hits_total"] - p.byName["kylix_chunk_cache_hits_total"]
		m := c.byName["kylix_chunk_cache_misses_total"] - p.byName["kylix_chunk_cache_misses_total"]
		if h+m <= 0 {
			return 0
		}
		return 100 * h / (h + m)
	}},
	{"cache", "miss/s", "cache_misses_per_second", false, rate("kylix_chunk_cache_misses_total")},
	{"chunk", "err/s", "chunk_errors_per_second", false, rate("kylix_chunk_errors_total")},
	{"client", "req/s", "client_requests_per_second", false, rate("kylix_client_requests_total")},
	{"client", "ref/s", "client_refused_per_second", false, rate("kylix_client_requests_refused_total")},
	{"client", "fds", "client_pack_fd_bytes_per_second", true, rate("kylix_client_pack_fd_bytes_total")},
	{"gpu", "fill", "gpu_fill_bytes_per_second", true, rate("kylix_gpu_fill_bytes_total")},
	{"store", "import", "import_bytes_per_second", true, rate("kylix_import_bytes_total")},
	{"store", "export", "export_bytes_per_second", true, rate("kylix_export_bytes_total")},
	{"kv", "mem/s", "kv_memory_hits_per_second", false, rateOf(`kylix_kv_hits_total{tier="memory"}`)},
	{"kv", "disk/s", "kv_disk_hits_per_second", false, rateOf(`kylix_kv_hits_total{tier="disk"}`)},
	{"kv", "miss/s", "kv_misses_per_second", false, rate("kylix_kv_misses_total")},
	{"kv", "memb/s", "kv_member_hits_per_second", false, rate("kylix_kv_member_hits_total")},
	{"kv", "read", "kv_read_bytes_per_second", true, rate("kylix_kv_read_bytes_total")},
	{"kv", "get-ms", "kv_get_mean_ms", false, func(p, c sample, _ float64) float64 {
		n := c.byName["kylix_kv_get_seconds_count"] - p.byName["kylix_kv_get_seconds_count"]
		if n <= 0 {
			return 0
		}
		return 1000 * max(0, c.byName["kylix_kv_get_seconds_sum"]-p.byName["kylix_kv_get_seconds_sum"]) / n
	}},
}

// topJSON is one line of kylix top --json.
type topJSON struct {
	Time            time.Time          `json:"time"`
	IntervalSeconds float64            `json:"interval_seconds"`
	Columns         map[string]float64 `json:"columns"`
	// Metrics are the node's kylix_* series now: counters (totals since
	// the node started) and gauges, keyed as the text format writes them.
	Metrics map[string]float64 `json:"metrics"`
}

func runTop(ctx context.Context, e *env, args []string) error {
	return runTopAs(ctx, e, "top", args)
}

// runTopAs runs kylix top under the name it was called by (top, stats).
func runTopAs(ctx context.Context, e *env, name string, args []string) error {
	f := newFlags(e, name, "[--data DIR] [--url URL] [--interval D] [--count N] [--json]", `
Shows what the node serving the data directory does, one line per
interval (like juicefs stats): the node's CPU and memory; opens, open
files, bytes the node served to reads through the mount, and the sizes of
files opened by passthrough (the kernel reads those without the node);
the chunk cache's hit rate and misses; chunk read errors; client-socket
requests, refusals and pack fds handed out; GPU fills; imports and
exports; the KV-cache store's block gets answered from host memory, from
disk and by another member, its misses, the bytes it returned and the
mean time of a get that hit (0 on a node without one).
Rates are per second
over the interval.

The figures come from the node's metrics (docs/design/metrics.md): through
its admin socket, or with --url from a node's --metrics endpoint
(http://HOST:PORT/metrics), which also works for another user's node or
another machine. Stop with Ctrl-C; --count N stops after N lines.
--json prints one JSON object per line instead.`).withJSON()
	url := f.String("url", "", "read the metrics from this URL (a node's --metrics endpoint; HOST:PORT means http://HOST:PORT/metrics) instead of the admin socket")
	interval := f.Duration("interval", time.Second, "time between lines")
	count := f.Int("count", 0, "stop after this many lines (0: until interrupted)")
	if err := f.parse(args, 0, 0); err != nil {
		return err
	}
	if *interval <= 0 {
		return fmt.Errorf("top: --interval must be positive, got %s", *interval)
	}
	var gather func() (sample, error)
	switch {
	case *url != "":
		u := metricsURL(*url)
		gather = func() (sample, error) { return scrape(ctx, u) }
	default:
		// The node's registry, through the admin socket.
		gather = func() (sample, error) {
			var rep node.MetricsReply
			if err := f.call(ctx, node.OpMetrics, nil, &rep, nil); err != nil {
				return sample{}, noNode(err, fmt.Sprintf("top: no node serves %s; kylix top shows a running node (start one with kylix serve), or give --url http://ADDR/metrics of a node started with --metrics ADDR", f.data))
			}
			fams, err := parseMetrics(strings.NewReader(rep.Text))
			if err != nil {
				return sample{}, err
			}
			return flattenMap(fams), nil
		}
	}
	prev, err := gather()
	if err != nil {
		return err
	}
	prevT := time.Now()
	t := time.NewTicker(*interval)
	defer t.Stop()
	for n := 0; *count <= 0 || n < *count; n++ {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		cur, err := gather()
		if err != nil {
			return err
		}
		curT := time.Now()
		dt := curT.Sub(prevT).Seconds()
		if f.jsonOut {
			out := topJSON{Time: curT.UTC(), IntervalSeconds: dt, Columns: map[string]float64{}, Metrics: map[string]float64{}}
			for _, c := range topColumns {
				out.Columns[c.key] = c.value(prev, cur, dt)
			}
			for k, v := range cur.series {
				if strings.HasPrefix(k, "kylix_") {
					out.Metrics[k] = v
				}
			}
			if err := f.printJSONLine(out); err != nil {
				return err
			}
		} else {
			// The header again every screenful on a terminal.
			if n == 0 || (e.tty && n%24 == 0) {
				fmt.Fprintln(e.stdout, topHeader())
			}
			fmt.Fprintln(e.stdout, topLine(prev, cur, dt))
		}
		prev, prevT = cur, curT
	}
	return nil
}

// printJSONLine prints v as one line (for streams of objects).
func (f *flags) printJSONLine(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = f.e.stdout.Write(append(b, '\n'))
	return err
}

const topWidth = 7

func topHeader() string {
	var groups, names strings.Builder
	for i := 0; i < len(topColumns); {
		j := i
		for j < len(topColumns) && topColumns[j].group == topColumns[i].group {
			j++
		}
		w := (j-i)*(topWidth+1) - 1
		g := topColumns[i].group
		pad := max(0, w-len(g))
		fmt.Fprintf(&groups, "%s%s%s|", strings.Repeat("-", pad/2), g, strings.Repeat("-", pad-pad/2))
		for _, c := range topColumns[i:j] {
			fmt.Fprintf(&names, "%*s ", topWidth, c.name)
		}
		i = j
	}
	return strings.TrimSuffix(groups.String(), "|") + "\n" + strings.TrimRight(names.String(), " ")
}

func topLine(prev, cur sample, dt float64) string {
	var b strings.Builder
	for i, c := range topColumns {
		if i > 0 {
			b.WriteByte(' ')
		}
		v := c.value(prev, cur, dt)
		s := fmt.Sprintf("%.0f", v)
		if c.bytes {
			s = shortBytes(v)
		} else if v > 0 && v < 10 && v != float64(int64(v)) {
			s = fmt.Sprintf("%.1f", v)
		}
		fmt.Fprintf(&b, "%*s", topWidth, s)
	}
	return b.String()
}

// shortBytes formats a byte count in at most 6 characters: 0, 512, 12.3K,
// 1.5G.
func shortBytes(v float64) string {
	const units = "KMGTPE"
	if v < 1024 {
		return fmt.Sprintf("%.0f", v)
	}
	i := -1
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if v < 100 {
		return fmt.Sprintf("%.1f%c", v, units[i])
	}
	return fmt.Sprintf("%.0f%c", v, units[i])
}

// metricsURL completes HOST:PORT to http://HOST:PORT/metrics.
func metricsURL(u string) string {
	if !strings.Contains(u, "://") {
		u = "http://" + u
	}
	if rest := u[strings.Index(u, "://")+3:]; !strings.Contains(rest, "/") {
		u += "/metrics"
	}
	return u
}

// scrape reads a node's metrics endpoint.
func scrape(ctx context.Context, url string) (sample, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return sample{}, fmt.Errorf("top: --url %s: %w", url, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return sample{}, fmt.Errorf("top: reading the node's metrics: %w (is the node started with --metrics?)", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return sample{}, fmt.Errorf("top: reading the node's metrics at %s: %s", url, resp.Status)
	}
	fams, err := parseMetrics(resp.Body)
	if err != nil {
		return sample{}, fmt.Errorf("top: %s: %w", url, err)
	}
	return flattenMap(fams), nil
}

// flattenMap is flatten of parsed families.
func flattenMap(fams map[string]*dto.MetricFamily) sample {
	list := make([]*dto.MetricFamily, 0, len(fams))
	for _, mf := range fams {
		list = append(list, mf)
	}
	return flatten(list)
}

// parseMetrics parses Prometheus' text exposition format.
func parseMetrics(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(r)
}

// flatten turns metric families into a sample (counters, gauges and
// untyped values; of a histogram its count and sum, by name only;
// summaries are left out).
func flatten(fams []*dto.MetricFamily) sample {
	s := sample{series: map[string]float64{}, byName: map[string]float64{}}
	for _, mf := range fams {
		name := mf.GetName()
		for _, m := range mf.GetMetric() {
			var v float64
			switch {
			case m.Counter != nil:
				v = m.GetCounter().GetValue()
			case m.Gauge != nil:
				v = m.GetGauge().GetValue()
			case m.Untyped != nil:
				v = m.GetUntyped().GetValue()
			case m.Histogram != nil:
				// Its count and sum, under the names the text format
				// gives them (for mean latencies over an interval).
				for suffix, hv := range map[string]float64{"_count": float64(m.GetHistogram().GetSampleCount()), "_sum": m.GetHistogram().GetSampleSum()} {
					s.byName[name+suffix] += hv
				}
				continue
			default:
				continue
			}
			key := name
			if lp := m.GetLabel(); len(lp) > 0 {
				var parts []string
				for _, l := range lp {
					parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
				}
				sort.Strings(parts)
				key += "{" + strings.Join(parts, ",") + "}"
			}
			s.series[key] = v
			s.byName[name] += v
		}
	}
	return s
}

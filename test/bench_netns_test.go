package test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The benchmark of issue 9, deliverable 8 (docs/bench.md, "Peers: fetch
// of a 4 GiB model from three members in network namespaces"): three real
// `kylix serve` members, each in its own network namespace and each
// holding the whole model, and a fourth that reads it through its mount;
// against, in the same namespaces, the ceiling (test/ceiling): three plain
// Go servers and a receiver on as many connections, TLS 1.3 (or plain TCP
// for the plaintext data plane) and BLAKE3 on the receiver. Both data
// planes, runs interleaved, CPU time of every process measured.
//
//	KYLIX_BENCH=1 go test ./test -run 'TestBenchFetch3Netns$' -count=1 -v -timeout 60m
//
// KYLIX_BENCH_MIB sets the model's size (default 4096), KYLIX_BENCH_REPS
// the pairs of runs per data plane (default 3). KYLIX_BENCH_PROFILE=DIR
// writes a CPU profile of each holder and reader there (KYLIX_CPUPROFILE
// of serve; a holder's covers its whole life, a reader's its run).

// benchGate skips unless KYLIX_BENCH=1 (make test does not run benchmarks).
func benchGate(t *testing.T) {
	if os.Getenv("KYLIX_BENCH") != "1" {
		t.Skip("a benchmark: KYLIX_BENCH=1 runs it (docs/bench.md)")
	}
	requireFUSE(t)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// cpuOf is the user + system CPU time process pid has used (/proc).
func cpuOf(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / 100 // clock ticks (USER_HZ)
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// modelFiles writes n files of size/n random bytes under dir.
func modelFiles(t *testing.T, dir string, n int, size int64) []string {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	var seed [32]byte
	rand.Read(seed[:])
	rng := mrand.NewChaCha8(seed)
	buf := make([]byte, 1<<20)
	var ps []string
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("part-%02d.safetensors", i))
		f, err := os.Create(p)
		require.NoError(t, err)
		for left := size / int64(n); left > 0; left -= int64(len(buf)) {
			rng.Read(buf)
			_, err := f.Write(buf[:min(left, int64(len(buf)))])
			require.NoError(t, err)
		}
		require.NoError(t, f.Close())
		ps = append(ps, p)
	}
	return ps
}

// selfSigned writes a certificate (for the name "ceiling") and its key.
func selfSigned(t *testing.T, dir string) (cert, key string) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ceiling"}, DNSNames: []string{"ceiling"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	require.NoError(t, err)
	kd, err := x509.MarshalECPrivateKey(k)
	require.NoError(t, err)
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), 0o600))
	return cert, key
}

// ceilingResult is the JSON line of `ceiling recv` and `ceiling read`.
type ceilingResult struct {
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
	User    float64 `json:"user_s"`
	Sys     float64 `json:"sys_s"`
}

func runCeiling(t *testing.T, cmd *exec.Cmd) ceilingResult {
	t.Helper()
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, ee.Stderr)
	}
	require.NoError(t, err)
	var r ceilingResult
	require.NoError(t, json.Unmarshal(out, &r), "%s", out)
	return r
}

// benchRun is one timed transfer: MB/s, and CPU seconds per GB moved of
// the receiving side (reader node + reader, or the ceiling's receiver) and
// of the sending side (the three holders or servers).
type benchRun struct {
	mbps, recvCPU, sendCPU float64
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// profiled runs start (a node's start) with KYLIX_CPUPROFILE set to
// name.prof under $KYLIX_BENCH_PROFILE, when that is set.
func profiled(name string, start func()) {
	dir := os.Getenv("KYLIX_BENCH_PROFILE")
	if dir == "" {
		start()
		return
	}
	os.Setenv("KYLIX_CPUPROFILE", filepath.Join(dir, name+".prof"))
	defer os.Unsetenv("KYLIX_CPUPROFILE")
	start()
}

// buildCeiling builds test/ceiling into dir and returns its path.
func buildCeiling(t *testing.T, dir string) string {
	t.Helper()
	ceiling := filepath.Join(dir, "ceiling")
	if out, err := exec.Command("go", "build", "-o", ceiling, "github.com/kylix/kylix/test/ceiling").CombinedOutput(); err != nil {
		t.Fatalf("building test/ceiling: %v\n%s", err, out)
	}
	return ceiling
}

// ceilingServers starts test/ceiling's server (port 7950, with tlsArgs) in
// the namespaces of members 0 to n-1; stop kills them.
func ceilingServers(t *testing.T, c *netnsCluster, ceiling string, n int, tlsArgs []string) (servers []*exec.Cmd, addrs []string, stop func()) {
	t.Helper()
	for i := range n {
		addr := c.addr(i) + ":7950"
		s := exec.Command(c.nsent, append([]string{"--net=/var/run/netns/" + c.nodes[i], ceiling, "serve", "-listen", addr}, tlsArgs...)...)
		s.Stderr = os.Stderr
		require.NoError(t, s.Start())
		servers = append(servers, s)
		addrs = append(addrs, addr)
	}
	return servers, addrs, func() {
		for _, s := range servers {
			s.Process.Kill()
			s.Wait()
		}
	}
}

func TestBenchFetch3Netns(t *testing.T) {
	benchGate(t)
	size := int64(envInt("KYLIX_BENCH_MIB", 4096)) << 20
	reps := envInt("KYLIX_BENCH_REPS", 3)
	const nfiles, conns = 8, 4 // conns: the data plane's connections to each member (peers/transport.go)
	work := t.TempDir()
	ceiling := buildCeiling(t, work)
	cert, ckey := selfSigned(t, work)
	c := newNetnsCluster(t, 4)
	key := clusterKey(t)
	src := modelFiles(t, filepath.Join(work, "model"), nfiles, size)
	t.Cleanup(func() { os.RemoveAll(filepath.Join(work, "model")) })
	var names []string
	for _, p := range src {
		names = append(names, "model/"+filepath.Base(p))
	}

	// Holders: R = 3, so each of the three keeps the whole model (a reader
	// with little disk joining later owns almost nothing; see below).
	type holder struct{ data, mnt string }
	var hs []holder
	for range 3 {
		d, m := dirs(t)
		hs = append(hs, holder{d, m})
	}
	startHolders := func(plane string) []*member {
		extra := []string{"--data-plane", plane, "--replicas", "3"}
		var ms []*member
		for i := range 3 {
			var join []int
			if i > 0 {
				join = []int{0}
			}
			profiled(fmt.Sprintf("holder%d-%s", i, plane), func() {
				ms = append(ms, c.startAt(i, hs[i].data, hs[i].mnt, key, extra, join...))
			})
		}
		for _, m := range ms {
			waitFor(t, membershipWait, "three alive holders", func() bool { return aliveCount(t, m) == 3 })
		}
		return ms
	}
	ms := startHolders("tls")
	began := time.Now()
	for i, p := range src {
		mustKylix(t, "/", "import", "--data", ms[0].data, p, names[i])
	}
	// Push on import sends the other two holders their chunks; placement
	// pulls what a push missed.
	waitFor(t, 30*time.Minute, "the model on all three holders", func() bool {
		for _, m := range ms {
			if _, pl := peersJSON(t, m); pl.Passes == 0 || pl.OwnedMissing != 0 || pl.Members != 3 || pl.OwnedChunks == 0 {
				return false
			}
		}
		return true
	})
	_, pl := peersJSON(t, ms[2])
	t.Logf("model: %d MiB in %d files, %d chunks; imported on n0 and pushed to n1, n2 in %v", size>>20, nfiles, pl.OwnedChunks, time.Since(began).Round(time.Second))

	results := map[string][]benchRun{}
	for _, plane := range []string{"tls", "plaintext"} {
		if plane != "tls" {
			for _, m := range ms {
				m.stop()
			}
			ms = startHolders(plane)
		}
		// freshReader starts a reader with no caches in n3 and waits until
		// the holders' placement pass after its join is over.
		freshReader := func(name string) *member {
			before := map[*member]int64{}
			for _, m := range ms {
				_, pl := peersJSON(t, m)
				before[m] = pl.Passes
			}
			// --role reader: the reader owns no chunks, so placement pulls
			// nothing to it and the holders keep theirs. --peer-cache 0:
			// nothing written to disk (the ceiling writes nothing).
			var rd *member
			profiled(name, func() {
				rd = c.start(3, key, []string{"--data-plane", plane, "--replicas", "3", "--role", "reader", "--peer-cache", "0"}, 0)
			})
			waitFor(t, membershipWait, "four alive members", func() bool {
				for _, m := range append(ms, rd) {
					if aliveCount(t, m) != 4 {
						return false
					}
				}
				return true
			})
			// The holders' placement pass after the join (a holder asks the
			// owners of the chunks it no longer owns; the reader has none,
			// so it keeps them) is over before the timer.
			waitFor(t, 2*time.Minute, "the holders' placement pass with four members", func() bool {
				for _, m := range ms {
					if _, pl := peersJSON(t, m); pl.Passes <= before[m] || pl.Members != 4 {
						return false
					}
				}
				return true
			})
			return rd
		}
		for rep := range reps {
			// The kylix fetch through the mount: a fresh reader in n3.
			rd := freshReader(fmt.Sprintf("reader-%s-%d", plane, rep+1))
			var paths []string
			for _, n := range names {
				paths = append(paths, filepath.Join(rd.mnt, n))
			}
			waitFor(t, time.Minute, "the model in the reader's mount", func() bool {
				for _, p := range paths {
					if !visible(p)() {
						return false
					}
				}
				return true
			})
			load := loadAvg()
			cpu0 := map[int]float64{}
			for _, m := range append(ms, rd) {
				cpu0[m.cmd.Process.Pid] = cpuOf(t, m.cmd.Process.Pid)
			}
			r := runCeiling(t, exec.Command(ceiling, "read", "-files", strings.Join(paths, ",")))
			require.Equal(t, size/nfiles*nfiles, r.Bytes)
			var send float64
			for _, m := range ms {
				send += cpuOf(t, m.cmd.Process.Pid) - cpu0[m.cmd.Process.Pid]
			}
			recvCPU := cpuOf(t, rd.cmd.Process.Pid) - cpu0[rd.cmd.Process.Pid] + r.User + r.Sys
			gb := float64(r.Bytes) / 1e9
			fr := benchRun{float64(r.Bytes) / 1e6 / r.Seconds, recvCPU / gb, send / gb}
			results["fetch "+plane] = append(results["fetch "+plane], fr)
			served := 0
			for _, m := range ms {
				for _, p := range swarmJSON(t, m).Members {
					if p.Self && p.ServedPackBytes > 0 {
						served++
					}
				}
			}
			fetched := int64(0)
			for _, p := range swarmJSON(t, rd).Members {
				fetched += p.FetchedBytes
			}
			t.Logf("fetch %s #%d: %.0f MB/s, receiver %.2f cores/(GB/s) (node %.2f, reader %.2f), senders %.2f; %d holders served, reader fetched %d MiB; load %s",
				plane, rep+1, fr.mbps, fr.recvCPU, (recvCPU-r.User-r.Sys)/gb, (r.User+r.Sys)/gb, fr.sendCPU, served, fetched>>20, load)
			rd.stop()
			os.RemoveAll(filepath.Dir(rd.data))

			// The kylix fetch into memory, not through the mount: kylix load
			// --device host on another fresh reader (the fetched chunks go
			// from the socket into the load pipeline's buffers and from
			// there into host memory; gpuio.md, "Chunks stored
			// elsewhere"). Two passes in one command: the first also grows
			// the fresh node's heap and the host device's memory (on this
			// machine every first touch of a page is expensive; a GPU's
			// memory is not host pages), the second, which reuses that
			// memory as GPU allocators do (HostDevice.Reuse), is counted.
			// --verify-on cpu: the host device would otherwise hash on the
			// CPU what a GPU hashes. The node's CPU per pass is its own
			// count (the report's cpu_seconds); the holders' is split
			// evenly between the passes, which move the same bytes.
			rd = freshReader(fmt.Sprintf("loader-%s-%d", plane, rep+1))
			load = loadAvg()
			cpu0 = map[int]float64{}
			for _, m := range ms {
				cpu0[m.cmd.Process.Pid] = cpuOf(t, m.cmd.Process.Pid)
			}
			cmd := exec.Command(kylixBin, append([]string{"load", "--data", rd.data, "--device", "host", "--verify-on", "cpu", "--files", strconv.Itoa(nfiles), "--repeat", "2", "--json"}, names...)...)
			out, err := cmd.Output()
			require.NoError(t, err, "kylix load on the reader: %s", out)
			send = 0
			for _, m := range ms {
				send += cpuOf(t, m.cmd.Process.Pid) - cpu0[m.cmd.Process.Pid]
			}
			dec := json.NewDecoder(bytes.NewReader(out))
			for pass := range 2 {
				var lr struct {
					Bytes   int64   `json:"bytes"`
					Seconds float64 `json:"seconds"`
					Fetched int64   `json:"fetched_bytes"`
					CPU     float64 `json:"cpu_seconds"`
				}
				require.NoError(t, dec.Decode(&lr), "%s", out)
				require.Equal(t, size/nfiles*nfiles, lr.Bytes)
				gb := float64(lr.Bytes) / 1e9
				lrun := benchRun{float64(lr.Bytes) / 1e6 / lr.Seconds, lr.CPU / gb, send / 2 / gb}
				if pass == 1 {
					results["load "+plane] = append(results["load "+plane], lrun)
				}
				t.Logf("load %s #%d pass %d: %.0f MB/s, receiver %.2f cores/(GB/s), senders %.2f (half of both passes); fetched %d MiB; load %s",
					plane, rep+1, pass+1, lrun.mbps, lrun.recvCPU, lrun.sendCPU, lr.Fetched>>20, load)
			}
			rd.stop()
			os.RemoveAll(filepath.Dir(rd.data))

			// The ceiling: three servers in the holders' namespaces, the
			// receiver in the reader's.
			var tlsArgs []string
			if plane == "tls" {
				tlsArgs = []string{"-tls", "-cert", cert, "-key", ckey}
			}
			servers, addrs, stopServers := ceilingServers(t, c, ceiling, 3, tlsArgs)
			load = loadAvg()
			s0 := map[int]float64{}
			for _, s := range servers {
				s0[s.Process.Pid] = cpuOf(t, s.Process.Pid)
			}
			recv := exec.Command(c.nsent, append([]string{"--net=/var/run/netns/" + c.nodes[3], ceiling, "recv",
				"-servers", strings.Join(addrs, ","), "-conns", strconv.Itoa(conns), "-files", strings.Join(src, ",")}, tlsArgs...)...)
			r = runCeiling(t, recv)
			send = 0
			for _, s := range servers {
				send += cpuOf(t, s.Process.Pid) - s0[s.Process.Pid]
			}
			stopServers()
			gb = float64(r.Bytes) / 1e9
			cr := benchRun{float64(r.Bytes) / 1e6 / r.Seconds, (r.User + r.Sys) / gb, send / gb}
			results["ceiling "+plane] = append(results["ceiling "+plane], cr)
			t.Logf("ceiling %s #%d: %.0f MB/s, receiver %.2f cores/(GB/s), senders %.2f; load %s",
				plane, rep+1, cr.mbps, cr.recvCPU, cr.sendCPU, load)
		}
	}
	col := func(rs []benchRun, f func(benchRun) float64) (float64, string) {
		var xs []string
		var vs []float64
		for _, r := range rs {
			vs = append(vs, f(r))
			xs = append(xs, fmt.Sprintf("%.2f", f(r)))
		}
		return median(vs), strings.Join(xs, ", ")
	}
	for _, k := range []string{"fetch tls", "load tls", "ceiling tls", "fetch plaintext", "load plaintext", "ceiling plaintext"} {
		m, all := col(results[k], func(r benchRun) float64 { return r.mbps })
		rc, rall := col(results[k], func(r benchRun) float64 { return r.recvCPU })
		sc, sall := col(results[k], func(r benchRun) float64 { return r.sendCPU })
		t.Logf("| %s | %.0f (%s) | %.2f (%s) | %.2f (%s) |", k, m, all, rc, rall, sc, sall)
	}
	for _, plane := range []string{"tls", "plaintext"} {
		f, _ := col(results["fetch "+plane], func(r benchRun) float64 { return r.mbps })
		cl, _ := col(results["ceiling "+plane], func(r benchRun) float64 { return r.mbps })
		fc, _ := col(results["fetch "+plane], func(r benchRun) float64 { return r.recvCPU + r.sendCPU })
		cc, _ := col(results["ceiling "+plane], func(r benchRun) float64 { return r.recvCPU + r.sendCPU })
		t.Logf("%s: fetch / ceiling %.2f by MB/s, %.2f by CPU per byte (both ends); goal >= 0.8", plane, f/cl, cc/fc)
		l, _ := col(results["load "+plane], func(r benchRun) float64 { return r.mbps })
		lc, _ := col(results["load "+plane], func(r benchRun) float64 { return r.recvCPU + r.sendCPU })
		t.Logf("%s: load into memory / ceiling %.2f by MB/s, %.2f by CPU per byte (both ends); goal >= 0.8", plane, l/cl, cc/lc)
	}
}

// Command ceiling is the yardstick of the peers benchmark (docs/bench.md,
// "Peers: fetch of a 4 GiB model from three members in network
// namespaces"): the work a fetch from three members cannot skip, done by a
// plain Go program. It is built and run by test/bench_netns_test.go, not
// shipped.
//
//	ceiling serve -listen ADDR [-tls -cert F -key F]
//	ceiling recv -servers A,B,C -conns N -files F1,F2,... [-tls -cert F -key F]
//	ceiling read -files F1,F2,...
//
// serve answers requests "PATH OFFSET LENGTH\n" with those bytes of the
// file (pread in 1 MiB pieces). recv splits the files, taken end to end,
// into servers x conns equal ranges, dials every connection (TLS 1.3 with
// a client certificate, or plain TCP), then asks each range on its own
// connection and hashes every 1 MiB it receives with BLAKE3. read reads
// the files at once, one goroutine each, with plain 1 MiB reads (the
// reader of the mount). recv and read print one JSON line: bytes, seconds
// of the timed part, and the process's user and system CPU seconds in it.
package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/zeebo/blake3"
)

const piece = 1 << 20

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: ceiling serve|recv|read [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	listen := fs.String("listen", "", "serve: address")
	servers := fs.String("servers", "", "recv: server addresses, comma-separated")
	conns := fs.Int("conns", 4, "recv: connections to each server")
	files := fs.String("files", "", "recv, read: files, comma-separated")
	useTLS := fs.Bool("tls", false, "TLS 1.3 with -cert and -key (both ends present it; each trusts it)")
	certF := fs.String("cert", "", "PEM certificate")
	keyF := fs.String("key", "", "PEM key")
	fs.Parse(os.Args[2:])
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(*listen, tlsFor(*useTLS, *certF, *keyF, true))
	case "recv":
		err = recv(strings.Split(*servers, ","), *conns, strings.Split(*files, ","), tlsFor(*useTLS, *certF, *keyF, false))
	case "read":
		err = read(strings.Split(*files, ","))
	default:
		err = fmt.Errorf("unknown mode %q: use serve, recv or read", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ceiling:", err)
		os.Exit(1)
	}
}

func tlsFor(on bool, certF, keyF string, server bool) *tls.Config {
	if !on {
		return nil
	}
	cert, err := tls.LoadX509KeyPair(certF, keyF)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ceiling:", err)
		os.Exit(1)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "ceiling:", err)
		os.Exit(1)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	if server {
		return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
			ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: "ceiling"}
}

func serve(addr string, cfg *tls.Config) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		if cfg != nil {
			c = tls.Server(c, cfg)
		}
		go func() {
			defer c.Close()
			r := bufio.NewReader(c)
			buf := make([]byte, piece)
			files := map[string]*os.File{}
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				var path string
				var off, n int64
				if _, err := fmt.Sscan(line, &path, &off, &n); err != nil {
					return
				}
				f := files[path]
				if f == nil {
					if f, err = os.Open(path); err != nil {
						return
					}
					defer f.Close()
					files[path] = f
				}
				for n > 0 {
					k, err := f.ReadAt(buf[:min(n, piece)], off)
					if k == 0 && err != nil {
						return
					}
					if _, err := c.Write(buf[:k]); err != nil {
						return
					}
					off, n = off+int64(k), n-int64(k)
				}
			}
		}()
	}
}

// segment is a part of one file.
type segment struct {
	path   string
	off, n int64
}

func recv(servers []string, per int, files []string, cfg *tls.Config) error {
	var total int64
	var all []segment
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			return err
		}
		all = append(all, segment{f, 0, st.Size()})
		total += st.Size()
	}
	nconn := len(servers) * per
	// Range i of the files end to end: [i*total/nconn, (i+1)*total/nconn).
	ranges := make([][]segment, nconn)
	for i := range nconn {
		lo, hi := int64(i)*total/int64(nconn), int64(i+1)*total/int64(nconn)
		var base int64
		for _, s := range all {
			a, b := max(lo, base), min(hi, base+s.n)
			if a < b {
				ranges[i] = append(ranges[i], segment{s.path, a - base, b - a})
			}
			base += s.n
		}
	}
	cs := make([]net.Conn, nconn)
	for i := range nconn {
		addr := servers[i%len(servers)]
		var c net.Conn
		var err error
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if c, err = net.Dial("tcp", addr); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			return err
		}
		if cfg != nil {
			tc := tls.Client(c, cfg)
			if err := tc.Handshake(); err != nil {
				return fmt.Errorf("TLS handshake with %s: %w", addr, err)
			}
			c = tc
		}
		defer c.Close()
		cs[i] = c
	}
	ru0 := rusage()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, nconn)
	var mu sync.Mutex
	var got int64
	sink := make([]byte, nconn) // keeps the hashes live
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, piece)
			var n int64
			for _, s := range ranges[i] {
				if _, err := fmt.Fprintf(c, "%s %d %d\n", s.path, s.off, s.n); err != nil {
					errs <- err
					return
				}
				for left := s.n; left > 0; {
					k := min(left, piece)
					if _, err := io.ReadFull(c, buf[:k]); err != nil {
						errs <- err
						return
					}
					sum := blake3.Sum256(buf[:k])
					sink[i] ^= sum[0]
					left -= k
					n += k
				}
			}
			mu.Lock()
			got += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	if got != total {
		return fmt.Errorf("received %d bytes, want %d (hash byte %x)", got, total, sink)
	}
	return report(got, took, ru0)
}

func read(files []string) error {
	ru0 := rusage()
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var got int64
	var first error
	for _, p := range files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.Open(p)
			var n int64
			if err == nil {
				n, err = io.CopyBuffer(io.Discard, struct{ io.Reader }{f}, make([]byte, piece))
				f.Close()
			}
			mu.Lock()
			got += n
			if err != nil && first == nil {
				first = fmt.Errorf("%s: %w", p, err)
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	took := time.Since(start)
	if first != nil {
		return first
	}
	return report(got, took, ru0)
}

type result struct {
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
	User    float64 `json:"user_s"`
	Sys     float64 `json:"sys_s"`
}

func report(n int64, took time.Duration, ru0 syscall.Rusage) error {
	ru := rusage()
	sec := func(tv syscall.Timeval) float64 { return float64(tv.Sec) + float64(tv.Usec)/1e6 }
	return json.NewEncoder(os.Stdout).Encode(result{n, took.Seconds(), sec(ru.Utime) - sec(ru0.Utime), sec(ru.Stime) - sec(ru0.Stime)})
}

func rusage() syscall.Rusage {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru
}

package test

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/kylix/kylix"

// forbidden lists, for each of our packages (by prefix), the packages it
// must never import: the dependency arrows of docs/design/overview.md.
var forbidden = map[string][]string{
	"/chunkstore": {"/fs", "/gpuio", "/cuda", "/peers", "/cmd", "/node"},
	"/fs":         {"/peers", "/gpuio", "/cuda", "/cmd", "/node"},
	"/gpuio":      {"/fs", "/peers", "/cmd", "/node"},
	"/cuda":       {"/chunkstore", "/fs", "/gpuio", "/peers", "/cmd", "/internal", "/node"},
	"/peers":      {"/fs", "/gpuio", "/cuda", "/cmd", "/node"},
	// The stripe codec (docs/design/erasure.md): records, encoding and
	// verified decoding only, below the cluster that will store and fetch
	// its shards (peers imports it), so it never imports peers itself.
	"/peers/stripe": {"/peers", "/fs", "/gpuio", "/cuda", "/cmd", "/node"},
	"/internal":     {"/fs", "/gpuio", "/cuda", "/peers", "/cmd", "/node"},
	// The running node: it wires the store, the mount, the cluster and the
	// GPU paths; only the CLI (and tests) may import it.
	"/node": {"/cmd"},
	// Small shared helpers that chunkstore, peers, fs and the node use
	// (pacing, sizes, Unix sockets): leaves, so that any package may
	// import them without a cycle or a detour through the store.
	"/internal/pace":     leaf,
	"/internal/units":    leaf,
	"/internal/unixsock": leaf,
	// The client socket's wire format, mirrored in C (libkylix) and Python:
	// plain structs, so nothing of ours may leak into it.
	"/clientproto": {"/chunkstore", "/fs", "/gpuio", "/cuda", "/peers", "/cmd", "/internal", "/node"},
}

// leaf: every package of ours.
var leaf = []string{"/chunkstore", "/fs", "/gpuio", "/cuda", "/peers", "/cmd", "/node", "/clientproto", "/internal"}

type pkg struct {
	ImportPath string
	Dir        string
	Doc        string
	Name       string
	Imports    []string
	GoFiles    []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", module+"/...")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 8 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	return pkgs
}

// TestDependencyArrows guards the layering (in the style of tailscale's
// deptest): non-test imports only.
func TestDependencyArrows(t *testing.T) {
	for _, p := range listPackages(t) {
		rel := strings.TrimPrefix(p.ImportPath, module)
		for prefix, bad := range forbidden {
			if rel != prefix && !strings.HasPrefix(rel, prefix+"/") {
				continue
			}
			for _, imp := range p.Imports {
				for _, b := range bad {
					if imp == module+b || strings.HasPrefix(imp, module+b+"/") {
						t.Errorf("%s imports %s: the design forbids %s -> %s", p.ImportPath, imp, prefix, b)
					}
				}
			}
		}
		// io_uring only inside chunkstore's I/O subpackage, which owns its
		// binding (docs/design/storeio.md): no other package makes the
		// io_uring system calls itself.
		if rel != "/chunkstore/storeio" {
			for _, name := range p.GoFiles {
				b, err := os.ReadFile(filepath.Join(p.Dir, name))
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(string(b), "SYS_IO_URING") {
					t.Errorf("%s: makes io_uring system calls: io_uring belongs to chunkstore/storeio", filepath.Join(p.Dir, name))
				}
			}
		}
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, module+"/cmd") {
				t.Errorf("%s imports %s: nothing imports cmd", p.ImportPath, imp)
			}
		}
	}
}

// TestEveryPackageHasADocComment: each package says what it is for.
func TestEveryPackageHasADocComment(t *testing.T) {
	for _, p := range listPackages(t) {
		if strings.TrimSpace(p.Doc) == "" {
			t.Errorf("%s has no package doc comment", p.ImportPath)
		}
	}
}

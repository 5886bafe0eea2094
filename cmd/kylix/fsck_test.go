package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// packDigest is the sha256 of every file in the packs directory, by name.
func packDigest(t *testing.T, data string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(data, "packs"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(data, "packs", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = fmt.Sprintf("%x", sha256.Sum256(b))
	}
	return out
}

// garble writes pseudo-random bytes over every page of path after the two
// meta pages.
func garble(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	b := make([]byte, st.Size()-2*4096)
	x := uint32(7)
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteAt(b, 2*4096)
	return err
}

// TestDamagedIndexNeverDeletesPacks: with index.db deleted, truncated, empty
// or garbled, every command refuses with the command to run and leaves every
// pack as it was; `fsck --rebuild-index` then restores the store (export
// byte-identical to the source, verify passes).
func TestDamagedIndexNeverDeletesPacks(t *testing.T) {
	src := demo(t)
	seed := t.TempDir()
	mustKylix(t, seed, "import", filepath.Join(src, "base"), "models/base")
	mustKylix(t, seed, "import", filepath.Join(src, "finetuned"), "models/ft")
	if r := mustKylix(t, seed, "fsck"); !strings.Contains(r.stdout, "ok") {
		t.Fatalf("fsck on a healthy store: %s", r.stdout)
	}
	damage := map[string]func(string) error{
		"deleted":   os.Remove,
		"truncated": func(p string) error { return os.Truncate(p, 3*4096) },
		"empty":     func(p string) error { return os.Truncate(p, 0) },
		"garbled":   garble,
	}
	for name, fn := range damage {
		t.Run(name, func(t *testing.T) {
			data := t.TempDir()
			if out, err := exec.Command("cp", "-a", seed+"/.", data).CombinedOutput(); err != nil {
				t.Fatalf("cp: %v %s", err, out)
			}
			before := packDigest(t, data)
			if err := fn(filepath.Join(data, "index.db")); err != nil {
				t.Fatal(err)
			}
			for _, args := range [][]string{{"df"}, {"ls", "models"}, {"verify"}, {"export", "models/base", filepath.Join(t.TempDir(), "x")}, {"fsck"}, {"gc"}} {
				r := kylix(t, data, args...)
				if r.code == 0 {
					t.Fatalf("kylix %v succeeded on a damaged index:\n%s", args, r.stdout)
				}
				if !strings.Contains(r.stderr, "kylix fsck --rebuild-index") || !strings.Contains(r.stderr, "Nothing was deleted") {
					t.Fatalf("kylix %v: the message does not say what to run:\n%s", args, r.stderr)
				}
			}
			// serve refuses before it mounts anything.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "serve", "--mount", filepath.Join(t.TempDir(), "mnt"))
			cmd.Env = append(os.Environ(), "KYLIX_TEST_AS_MAIN=1", "KYLIX_DATA="+data)
			out, err := cmd.CombinedOutput()
			if err == nil || ctx.Err() != nil || !strings.Contains(string(out), "kylix fsck --rebuild-index") {
				t.Fatalf("serve on a damaged index: %v (timeout: %v)\n%s", err, ctx.Err(), out)
			}
			if after := packDigest(t, data); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Fatalf("packs changed:\nbefore %v\nafter  %v", before, after)
			}
			r := mustKylix(t, data, "fsck", "--rebuild-index")
			if strings.Contains(r.stdout, "WARNING") {
				t.Fatalf("rebuild: %s", r.stdout)
			}
			mustKylix(t, data, "verify")
			mustKylix(t, data, "fsck")
			for _, m := range []string{"base", "finetuned"} {
				ns := map[string]string{"base": "models/base", "finetuned": "models/ft"}[m]
				out := filepath.Join(t.TempDir(), "out")
				mustKylix(t, data, "export", ns, out)
				sameTree(t, filepath.Join(src, m), out)
			}
		})
	}
}

// TestFsckFindsDisagreement: fsck exits 1 and names the problem when a pack
// file is missing or unknown.
func TestFsckFindsDisagreement(t *testing.T) {
	src := demo(t)
	data := t.TempDir()
	mustKylix(t, data, "import", filepath.Join(src, "base"), "models/base")
	stray := filepath.Join(data, "packs", "00000000000000ff.pack")
	if err := os.WriteFile(stray, []byte("stray"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := kylix(t, data, "fsck")
	if r.code != 1 || !strings.Contains(r.stdout, "00000000000000ff.pack") {
		t.Fatalf("fsck with a stray pack: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if _, err := os.Stat(stray); err != nil {
		t.Fatal("a pack nothing mentions was removed")
	}
}

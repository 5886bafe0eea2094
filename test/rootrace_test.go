package test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Root running import or export on a tree an unprivileged user controls,
// while that user (uid 65534) renames files, directories and symlinks in a
// tight loop (docs/design/rootops.md). The attacker is this test binary,
// copied where 65534 may run it and started with KYLIX_RACE_ATTACKER set.

const attackerEnv = "KYLIX_RACE_ATTACKER"

// TestRootRaceAttacker is the attacker's body; as an ordinary test it does
// nothing. Modes:
//
//	exchange A1 B1 A2 B2 ...: renameat2(RENAME_EXCHANGE) each pair, over and
//	  over, until stdin closes; "ready" once every pair has been swapped.
//	read MARKER DIR: walk DIR and print every file whose bytes this user
//	  could read and that contain MARKER.
func TestRootRaceAttacker(t *testing.T) {
	mode := os.Getenv(attackerEnv)
	if mode == "" {
		t.Skip("the attacker process of the root race tests (run by them, as uid 65534)")
	}
	args := flagArgs()
	switch mode {
	case "exchange":
		stop := make(chan struct{})
		go func() { io.Copy(io.Discard, os.Stdin); close(stop) }()
		for i := 0; ; i++ {
			for j := 0; j+1 < len(args); j += 2 {
				unix.Renameat2(unix.AT_FDCWD, args[j], unix.AT_FDCWD, args[j+1], unix.RENAME_EXCHANGE)
			}
			if i == 0 {
				fmt.Println("ready")
			}
			select {
			case <-stop:
				os.Exit(0)
			default:
			}
		}
	case "read":
		marker := []byte(args[0])
		filepath.Walk(args[1], func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, marker) {
					fmt.Println(p)
				}
			}
			return nil
		})
		os.Exit(0)
	}
	os.Exit(2)
}

// flagArgs are the attacker's arguments: what follows "--" on its command
// line.
func flagArgs() []string {
	for i, a := range os.Args {
		if a == "--" {
			return os.Args[i+1:]
		}
	}
	return nil
}

func attackerCmd(bin, mode string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, append([]string{"-test.run=^TestRootRaceAttacker$", "--"}, args...)...)
	// KYLIX_BIN set: TestMain does not build kylix again.
	cmd.Env = append(os.Environ(), attackerEnv+"="+mode, "KYLIX_BIN="+kylixBin)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	return cmd
}

// exchanging starts the attacker swapping each pair of paths and returns
// once it has swapped them all at least once; stop ends it.
func exchanging(t *testing.T, bin string, pairs ...string) (stop func()) {
	t.Helper()
	cmd := attackerCmd(bin, "exchange", pairs...)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(outp).ReadString('\n')
	if err != nil || line != "ready\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("attacker did not start: %q %v", line, err)
	}
	return func() {
		in.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("attacker: %v", err)
		}
	}
}

// chownAll gives root..., every path in ps, to uid and gid 65534 (lchown:
// links themselves).
func chownAll(t *testing.T, ps ...string) {
	t.Helper()
	for _, p := range ps {
		if err := os.Lchown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
}

// entriesUnder lists everything below dir (relative paths), or nil.
func entriesUnder(dir string) []string {
	var out []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && p != dir {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	return out
}

// TestRootExportRaceStaysInDestination: root exports into a directory a
// user owns (base/u/aN/out, with base/u/aN the user's) while the user swaps
// both the directory on the way (aN) and the destination (out) for symlinks
// to a root-owned directory, in a tight loop. No attempt may create
// anything in that directory: an export either fails or writes beneath the
// directory it opened.
func TestRootExportRaceStaysInDestination(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the attacker runs as uid 65534")
	}
	base := openTempDir(t)
	bin := selfForOtherUser(t, base)
	data := filepath.Join(base, "data")
	src := filepath.Join(base, "src")
	for d := range 6 {
		dir := filepath.Join(src, fmt.Sprintf("d%d", d))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for f := range 6 {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d", f)), []byte(fmt.Sprintf("user content %d/%d\n", d, f)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	mustKylix(t, base, "import", "--data", data, src, "m")
	victim := filepath.Join(base, "victim") // root's, 0755
	if err := os.Mkdir(victim, 0o755); err != nil {
		t.Fatal(err)
	}
	u := filepath.Join(base, "u")
	if err := os.Mkdir(u, 0o755); err != nil {
		t.Fatal(err)
	}
	chownAll(t, u)

	deadline := time.Now().Add(6 * time.Second)
	attempts, failed := 0, 0
	for ; attempts < 40 && time.Now().Before(deadline); attempts++ {
		a := filepath.Join(u, fmt.Sprintf("a%d", attempts))
		ea := filepath.Join(u, fmt.Sprintf("e%d", attempts))
		out, eout := filepath.Join(a, "out"), filepath.Join(a, "eout")
		if err := os.Mkdir(a, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, l := range []string{ea, eout} {
			if err := os.Symlink(victim, l); err != nil {
				t.Fatal(err)
			}
		}
		chownAll(t, a, ea, eout)
		stop := exchanging(t, bin, a, ea, out, eout)
		_, errs, code := kylix(t, base, "export", "--data", data, "m", out)
		stop()
		if code != 0 {
			failed++
			t.Logf("attempt %d refused: %s", attempts, strings.TrimSpace(errs))
		}
		if got := entriesUnder(victim); len(got) > 0 {
			t.Fatalf("attempt %d: export as root wrote into %s, a directory the user swapped in through a symlink: %v", attempts, victim, got)
		}
	}
	t.Logf("%d exports raced, %d refused, none wrote outside the destination", attempts, failed)
}

// TestRootImportRaceKeepsOwners: root imports a user's tree while the user
// swaps each of its files with a symlink to a root-only file (0600) with
// RENAME_EXCHANGE, in a tight loop. Every stored file must carry the owner
// and mode of the file its bytes came from, so uid 65534 never reads the
// root-only bytes through the mount; a link to the root file that is not
// raced is kept as a link (as root, a link out of the tree is followed only
// to a file of the link's own owner).
func TestRootImportRaceKeepsOwners(t *testing.T) {
	requireFUSE(t)
	base := openTempDir(t)
	bin := selfForOtherUser(t, base)
	data, mnt := filepath.Join(base, "data"), filepath.Join(base, "mnt")
	const marker = "ROOT-ONLY-SECRET"
	secret := filepath.Join(base, "secret")
	if err := os.WriteFile(secret, []byte(marker+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	u := filepath.Join(base, "u")
	if err := os.Mkdir(u, 0o755); err != nil {
		t.Fatal(err)
	}
	var pairs []string
	for i := range 8 {
		f, l := filepath.Join(u, fmt.Sprintf("f%d", i)), filepath.Join(u, fmt.Sprintf("l%d", i))
		if err := os.WriteFile(f, []byte("user's own bytes\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(secret, l); err != nil {
			t.Fatal(err)
		}
		chownAll(t, f, l)
		pairs = append(pairs, f, l)
	}
	static := filepath.Join(u, "static")
	if err := os.Symlink(secret, static); err != nil {
		t.Fatal(err)
	}
	chownAll(t, u, static)
	startNode(t, data, mnt)

	// Without a race: the user's link to root's file is not followed.
	_, errs, code := kylix(t, base, "import", "--data", data, u, "calm")
	if code != 0 {
		t.Fatalf("import: exit %d: %s", code, errs)
	}
	if st, err := os.Lstat(filepath.Join(mnt, "calm", "static")); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Errorf("a user's link to a root-only file was not kept as a link: %v %v", st, err)
	}
	if !strings.Contains(errs, "static: kept as a symlink") {
		t.Errorf("import did not say why it kept the link:\n%s", errs)
	}

	stop := exchanging(t, bin, pairs...)
	deadline := time.Now().Add(6 * time.Second)
	attempts := 0
	for ; attempts < 40 && time.Now().Before(deadline); attempts++ {
		dest := fmt.Sprintf("r%d", attempts)
		if _, errs, code := kylix(t, base, "import", "--data", data, u, dest); code != 0 {
			t.Logf("attempt %d refused: %s", attempts, strings.TrimSpace(errs))
			continue
		}
		if bad := wrongOwners(t, filepath.Join(mnt, dest), marker); bad != "" {
			stop()
			t.Fatalf("attempt %d: %s", attempts, bad)
		}
	}
	stop()
	if out, err := attackerCmd(bin, "read", marker, mnt).Output(); err != nil || len(out) > 0 {
		t.Fatalf("uid 65534 read the root-only file's bytes through the mount (%v):\n%s", err, out)
	}
	t.Logf("%d imports raced", attempts)
}

// wrongOwners checks every file under dir (through the mount): the
// root-only bytes must be root's 0600, the user's bytes the user's 0644.
func wrongOwners(t *testing.T, dir, marker string) string {
	t.Helper()
	var bad []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", p, err))
			return nil
		}
		st := fi.Sys().(*syscall.Stat_t)
		want := [3]uint32{65534, 65534, 0o644}
		if bytes.Contains(b, []byte(marker)) {
			want = [3]uint32{0, 0, 0o600}
		}
		if got := [3]uint32{st.Uid, st.Gid, st.Mode & 0o7777}; got != want {
			bad = append(bad, fmt.Sprintf("%s holds %q stored as uid %d gid %d mode %#o, want uid %d gid %d mode %#o", p, bytes.TrimSpace(b), got[0], got[1], got[2], want[0], want[1], want[2]))
		}
		return nil
	})
	return strings.Join(bad, "\n")
}

package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
)

// owners returns "path: mode uid gid" for every entry below root, in walk
// order (lstat: symlinks are not followed).
func owners(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		rel, _ := filepath.Rel(root, p)
		fmt.Fprintf(&b, "%s: mode %07o uid %d gid %d\n", rel, st.Mode, st.Uid, st.Gid)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// openTempDir returns a temporary directory that other users can reach
// (t.TempDir makes it and its parent 0700).
func openTempDir(t *testing.T) string {
	t.Helper()
	base := t.TempDir()
	for _, d := range []string{base, filepath.Dir(base)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return base
}

// asUser runs a shell command as uid:gid (with supplementary groups).
func asUser(t *testing.T, dir string, uid, gid uint32, groups []uint32, script string) string {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: groups}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("as %d: %s: %v\n%s", uid, script, err, out)
	}
	return string(out)
}

// TestOwnersSurviveRestartAndExport: owners and modes set through the
// mount (by the users who create, and by chown/chmod) are the same after
// the node restarts, after `kylix export` as root, and after importing
// that export and exporting it again.
func TestOwnersSurviveRestartAndExport(t *testing.T) {
	requireFUSE(t)
	base := openTempDir(t) // other users reach the mount through it
	data, mnt := filepath.Join(base, "data"), filepath.Join(base, "mnt")
	n := startNode(t, data, mnt)
	m := filepath.Join(mnt, "m")
	run(t, mnt, "mkdir", "-m", "0777", "m")
	asUser(t, m, 65534, 65534, nil, "echo nobody > f && mkdir d && ln -s f l && echo x > d/x")
	run(t, m, "sh", "-c", `echo root > g && chown 1000:2000 g && chmod 4755 g &&
		mkdir s && chgrp 3000 s && chmod 2775 s && mkdir s/sub && echo y > s/y &&
		mkdir -m 0777 t && chmod +t t && echo z > t/z && chown -h 1000:1000 t/z &&
		ln -s g lg && chown -h 1000:2000 lg && chmod 2711 d`)
	asUser(t, m, 1000, 1000, []uint32{1000, 2000}, "echo w > t/w && chgrp 2000 t/w && chmod 2750 t/w")
	want := owners(t, m)
	for _, line := range []string{
		"f: mode 0100644 uid 65534 gid 65534",
		"g: mode 0104755 uid 1000 gid 2000",
		"s/sub: mode 0042755 uid 0 gid 3000",
		"s/y: mode 0100644 uid 0 gid 3000",
		"t: mode 0041777 uid 0 gid 0",
		"t/w: mode 0102750 uid 1000 gid 2000",
		"lg: mode 0120777 uid 1000 gid 2000",
		"d: mode 0042711 uid 65534 gid 65534",
	} {
		if !strings.Contains(want, line+"\n") {
			t.Fatalf("through the mount, want %q in:\n%s", line, want)
		}
	}
	n.stop()

	n = startNode(t, data, mnt)
	if got := owners(t, m); got != want {
		t.Fatalf("after a restart:\n%s\nwant:\n%s", got, want)
	}
	n.stop()

	if ls := mustKylix(t, base, "ls", "--data", data, "m"); !regexp.MustCompile(`-rwsr-xr-x +1000 +2000 .* g\n`).MatchString(ls) {
		t.Errorf("kylix ls does not show g's owner and setuid:\n%s", ls)
	}

	out := filepath.Join(base, "out")
	mustKylix(t, base, "export", "--data", data, "m", out)
	if got := owners(t, out); got != want {
		t.Fatalf("exported as root:\n%s\nwant:\n%s", got, want)
	}
	mustKylix(t, base, "import", "--data", data, out, "m2")
	out2 := filepath.Join(base, "out2")
	mustKylix(t, base, "export", "--data", data, "m2", out2)
	if got := owners(t, out2); got != want {
		t.Fatalf("imported and exported again:\n%s\nwant:\n%s", got, want)
	}
}

// TestExportAsNonRoot: a user who is not root gets the files as their own,
// without setuid and setgid, and is told so.
func TestExportAsNonRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run kylix as another user")
	}
	base := openTempDir(t)
	src := filepath.Join(base, "src")
	if err := os.MkdirAll(filepath.Join(src, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(src, "tool"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(src, "plain"), []byte("x"), 0o640)
	os.Chmod(filepath.Join(src, "tool"), 0o4755|os.ModeSetuid)
	os.Chmod(filepath.Join(src, "sub"), 0o2755|os.ModeSetgid)
	if err := os.Chown(base, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{src, filepath.Join(src, "sub"), filepath.Join(src, "tool"), filepath.Join(src, "plain")} {
		if err := os.Chown(p, 1000, 2000); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(src, "tool"), 0o4755|os.ModeSetuid) // chown cleared it
	os.Chmod(filepath.Join(src, "sub"), 0o2755|os.ModeSetgid)
	data := filepath.Join(base, "data")
	mustKylix(t, base, "import", "--data", data, src, "tree")
	// Hand the store to 65534, who then exports it.
	run(t, base, "chown", "-R", "65534:65534", data)
	out := filepath.Join(base, "out")
	cmd := exec.Command(kylixBin, "export", "--data", data, "tree", out)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	msg, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("export as 65534: %v\n%s", err, msg)
	}
	got := owners(t, out)
	for _, line := range []string{
		": mode 0040755 uid 65534 gid 65534",
		"tool: mode 0100755 uid 65534 gid 65534",
		"sub: mode 0040755 uid 65534 gid 65534",
		"plain: mode 0100640 uid 65534 gid 65534",
	} {
		if !strings.Contains(got, line+"\n") {
			t.Errorf("want %q in:\n%s", line, got)
		}
	}
	for _, say := range []string{"tool: setuid/setgid not restored", "sub: setuid/setgid not restored", "owners not restored (not root)"} {
		if !strings.Contains(string(msg), say) {
			t.Errorf("export did not say %q:\n%s", say, msg)
		}
	}
}

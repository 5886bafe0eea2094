package fs

import (
	"os"
	"testing"
)

func selfPid() int { return os.Getpid() }
func selfUID() int { return os.Getuid() }

// TestPermAllows: owner, then group (primary or supplementary), then
// others, as the kernel decides; root reads everything.
func TestPermAllows(t *testing.T) {
	p := perm{uid: 10, gid: 20, mode: 0o640}
	cases := []struct {
		c    Cred
		want uint32
		ok   bool
	}{
		{Cred{UID: 10, GID: 99}, 4, true},
		{Cred{UID: 10, GID: 20}, 1, false},                         // owner bits: rw-, no search
		{Cred{UID: 11, GID: 20}, 4, true},                          // group
		{Cred{UID: 11, GID: 21, Groups: []uint32{5, 20}}, 4, true}, // supplementary group
		{Cred{UID: 11, GID: 21}, 4, false},                         // others: ---
		{Cred{UID: 0, GID: 0}, 4, true},
		{Cred{UID: 10, GID: 20}, 2, true},
	}
	for i, c := range cases {
		if got := p.allows(c.c, c.want); got != c.ok {
			t.Errorf("case %d: %+v want %o: %v", i, c.c, c.want, got)
		}
	}
	// The owner's bits decide for the owner even where others' allow.
	if (perm{uid: 10, gid: 20, mode: 0o047}).allows(Cred{UID: 10, GID: 20}, 4) {
		t.Error("owner with --- read through group or other bits")
	}
}

// TestCredOfPeer reads this process's supplementary groups and refuses
// a uid the process does not have.
func TestCredOfPeer(t *testing.T) {
	if _, err := CredOfPeer(int32(selfPid()), 123456, 0); err == nil {
		t.Error("a uid the process does not have was accepted")
	}
	c, err := CredOfPeer(int32(selfPid()), uint32(selfUID()), 0)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	if len(want) != len(c.Groups) {
		t.Fatalf("groups %v, want %v", c.Groups, want)
	}
	for i, g := range want {
		if uint32(g) != c.Groups[i] {
			t.Fatalf("groups %v, want %v", c.Groups, want)
		}
	}
}

package main

import (
	"io/fs"
	"testing"

	"github.com/kylix/kylix/chunkstore"
)

func TestModeString(t *testing.T) {
	cases := []struct {
		e    chunkstore.Entry
		want string
	}{
		{chunkstore.Entry{Kind: chunkstore.KindFile, Mode: 0o644}, "-rw-r--r--"},
		{chunkstore.Entry{Kind: chunkstore.KindFile, Mode: 0o755 | fs.ModeSetuid}, "-rwsr-xr-x"},
		{chunkstore.Entry{Kind: chunkstore.KindFile, Mode: 0o644 | fs.ModeSetuid | fs.ModeSetgid}, "-rwSr-Sr--"},
		{chunkstore.Entry{Kind: chunkstore.KindDir, Mode: 0o777 | fs.ModeSticky}, "drwxrwxrwt"},
		{chunkstore.Entry{Kind: chunkstore.KindDir, Mode: 0o2770}, "drwxrwx---"}, // raw 0o2000 is not Go's setgid
		{chunkstore.Entry{Kind: chunkstore.KindDir, Mode: 0o770 | fs.ModeSetgid | fs.ModeSticky}, "drwxrws--T"},
		{chunkstore.Entry{Kind: chunkstore.KindSymlink, Mode: 0o777}, "lrwxrwxrwx"},
	}
	for _, c := range cases {
		if got := modeString(c.e); got != c.want {
			t.Errorf("modeString(%v) = %q, want %q", c.e.Mode, got, c.want)
		}
	}
}

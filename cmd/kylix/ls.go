package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/node"
)

func init() {
	register(&command{name: "ls", summary: "list a namespace directory", run: runLs})
}

type lsEntry struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	Mode string `json:"mode"`
	// UID and GID are absent for entries recorded before owners were
	// stored (the mount shows those as the node's user).
	UID    *uint32   `json:"uid,omitempty"`
	GID    *uint32   `json:"gid,omitempty"`
	Size   int64     `json:"size"`
	MTime  time.Time `json:"mtime"`
	ID     string    `json:"id,omitempty"`
	Target string    `json:"target,omitempty"`
	// Pinned and ResidentBytes: see kylix stat (pin.go).
	Pinned        bool   `json:"pinned"`
	ResidentBytes *int64 `json:"resident_bytes,omitempty"`
}

func runLs(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "ls", "[--data DIR] [--json] [-R] [PATH]", `
Lists the namespace directory PATH (default: the root), or shows PATH itself
if it is a file.`).withJSON()
	rec := f.BoolP("recursive", "R", false, "list subdirectories recursively")
	if err := f.parse(args, 0, 1); err != nil {
		return err
	}
	s, err := f.open()
	if err != nil {
		return err
	}
	defer s.Close()
	path := f.Arg(0)
	ent, err := s.Lookup(path)
	if err != nil {
		return err
	}
	var out []lsEntry
	clean, _ := chunkstore.CleanPath(path)
	pins := e.pinView(s)
	add := func(name string, c chunkstore.Entry) {
		le := lsEntry{Name: name, Kind: c.Kind.String(), Mode: modeString(c), Size: c.Size, MTime: time.Unix(0, c.MTime).UTC(), Target: c.Target}
		if c.UID != chunkstore.OwnerUnknown {
			le.UID = &c.UID
		}
		if c.GID != chunkstore.OwnerUnknown {
			le.GID = &c.GID
		}
		if c.Kind != chunkstore.KindSymlink {
			le.ID = c.ID.String()
		}
		full := name // -R and a file: the path; else a name in the directory
		if ent.Kind == chunkstore.KindDir && !*rec && clean != "" {
			full = clean + "/" + name
		}
		le.Pinned, _ = pins.Info(full, c)
		if c.Kind == chunkstore.KindFile {
			if file, err := s.OpenFile(c.ID); err == nil {
				r := node.FileResident(file)
				le.ResidentBytes = &r
			}
		}
		out = append(out, le)
	}
	switch {
	case ent.Kind != chunkstore.KindDir:
		add(path, ent)
	case *rec:
		err = s.Walk(path, func(p string, c chunkstore.Entry) error {
			if p != clean {
				add(p, c)
			}
			return ctx.Err()
		})
	default:
		var ents []chunkstore.Entry
		ents, err = s.List(path)
		for _, c := range ents {
			add(c.Name, c)
		}
	}
	if err != nil {
		return err
	}
	if f.jsonOut {
		if out == nil {
			out = []lsEntry{}
		}
		return f.printJSON(out)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 8, 1, ' ', tabwriter.AlignRight)
	if len(out) > 0 {
		// IN MEMORY: the share of the file in the page cache, and
		// "pinned" when a pin of the node holds it (residentColumn).
		fmt.Fprintf(tw, "%s\t %s\t %s\t%s\t %s\t%s\t %s\n", "MODE", "UID", "GID", "SIZE", "MODIFIED", " IN MEMORY", "NAME")
	}
	for _, le := range out {
		name := le.Name
		if le.Kind == "dir" {
			name += "/"
		} else if le.Target != "" {
			name += " -> " + le.Target
		}
		fmt.Fprintf(tw, "%s\t %s\t %s\t%s\t %s\t%s\t %s\n", le.Mode, idString(le.UID), idString(le.GID), human(le.Size), le.MTime.Local().Format("2006-01-02 15:04"), residentColumn(le), name)
	}
	return tw.Flush()
}

// residentColumn is ls's memory column: the share of a file in the page
// cache, and "pinned" when a pin of the node holds it.
func residentColumn(le lsEntry) string {
	col := ""
	if le.ResidentBytes != nil {
		pct := 100.0
		if le.Size > 0 {
			pct = 100 * float64(*le.ResidentBytes) / float64(le.Size)
		}
		col = fmt.Sprintf(" %.0f%%", pct)
	}
	if le.Pinned {
		col += " pinned"
	}
	return col
}

func idString(id *uint32) string {
	if id == nil {
		return "-"
	}
	return fmt.Sprint(*id)
}

// modeString is ls -l's mode column: type, then rwx per class with
// setuid, setgid and sticky as s/S and t/T.
func modeString(c chunkstore.Entry) string {
	b := []byte("-rwxrwxrwx")
	switch c.Kind {
	case chunkstore.KindDir:
		b[0] = 'd'
	case chunkstore.KindSymlink:
		b[0] = 'l'
	case chunkstore.KindFifo:
		b[0] = 'p'
	case chunkstore.KindSocket:
		b[0] = 's'
	case chunkstore.KindCharDev:
		b[0] = 'c'
	case chunkstore.KindBlockDev:
		b[0] = 'b'
	}
	u := chunkstore.UnixMode(c.Mode)
	for i := range 9 {
		if u&(1<<(8-i)) == 0 {
			b[1+i] = '-'
		}
	}
	special := func(pos int, bit uint32, set, unset byte) {
		if u&bit == 0 {
			return
		}
		if b[pos] == 'x' {
			b[pos] = set
		} else {
			b[pos] = unset
		}
	}
	special(3, 0o4000, 's', 'S')
	special(6, 0o2000, 's', 'S')
	special(9, 0o1000, 't', 'T')
	return string(b)
}

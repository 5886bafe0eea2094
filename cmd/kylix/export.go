package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/kylix/kylix/chunkstore"
)

func init() {
	register(&command{name: "export", summary: "write a stored file or tree back out, byte for byte", run: runExport})
}

func runExport(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "export", "[--data DIR] [--force] SRC DEST", `
Writes the file or tree at namespace path SRC to the local path DEST, verifying
every chunk against its hash on the way. A file is written under a temporary
name and renamed when complete, so a failure never leaves wrong bytes under the
real name. Existing files are not replaced unless --force is given. If SRC is a
file and DEST an existing directory, the file is written into it. Run as root,
export restores each entry's recorded owner, group and mode (setuid, setgid and
sticky included); run as another user, files belong to that user and setuid and
setgid bits are dropped, each one named in a note. DEST's parent directory is
opened once and everything below it is created without following symlinks;
run as root, a symlink on the way to DEST is followed only if root owns it.`)
	force := f.Bool("force", false, "replace existing files at DEST")
	if err := f.parse(args, 2, 2); err != nil {
		return err
	}
	s, err := f.open()
	if err != nil {
		return err
	}
	defer s.Close()
	p := newProgress(e, "export")
	var notes []string
	note := func(msg string) { notes = append(notes, msg) }
	files, n, err := s.Export(ctx, f.Arg(0), f.Arg(1), chunkstore.ExportOptions{Progress: p.update, Overwrite: *force, Note: note})
	p.finish()
	for _, msg := range notes {
		fmt.Fprintf(e.stderr, "kylix export: note: %s\n", msg)
	}
	if errors.Is(err, fs.ErrExist) && !*force {
		return fmt.Errorf("%w (kylix export --force replaces existing files)", err)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "exported %s -> %s: %d files, %s\n", f.Arg(0), f.Arg(1), files, human(n))
	if os.Geteuid() != 0 {
		fmt.Fprintf(e.stdout, "  owners not restored (not root): everything belongs to uid %d; %d setuid/setgid modes dropped\n", os.Geteuid(), len(notes))
	}
	return nil
}

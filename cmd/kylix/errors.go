package main

import (
	"errors"
	"fmt"
	"path"

	"github.com/kylix/kylix/chunkstore"
)

// userMessage words a command's error for the person who ran it: which path
// and what to do, in the store's terms rather than the code's. Errors about
// a namespace path (chunkstore.PathError) are said in full here; the rest
// already read that way where they are made (no package names: see
// TestErrorsNameNoPackage).
func userMessage(err error) string {
	var pe *chunkstore.PathError
	if !errors.As(err, &pe) {
		return err.Error()
	}
	p := pe.Path
	if p == "" {
		p = "/"
	}
	switch {
	case errors.Is(pe.Err, chunkstore.ErrNotFound):
		list := "kylix ls"
		if dir := path.Dir(pe.Path); dir != "." && dir != "/" {
			list += " " + dir
		}
		return fmt.Sprintf("%s: no such file or directory in the store (%s to list)", p, list)
	case errors.Is(pe.Err, chunkstore.ErrNotDir):
		return fmt.Sprintf("%s: not a directory in the store (kylix stat %s shows what it is)", p, p)
	case errors.Is(pe.Err, chunkstore.ErrIsDir):
		return fmt.Sprintf("%s: is a directory in the store (%s)", p, pe.Op)
	case errors.Is(pe.Err, chunkstore.ErrNotEmpty):
		if pe.Op == "remove" {
			return fmt.Sprintf("%s: directory not empty (kylix rm -r %s removes it and everything under it)", p, p)
		}
		return fmt.Sprintf("%s: directory not empty (%s)", p, pe.Op)
	}
	return err.Error()
}

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// The layout of a Hugging Face hub cache, as huggingface_hub writes it:
//
//	HUB/models--ORG--NAME/refs/BRANCH        (a file holding a commit hash)
//	HUB/models--ORG--NAME/snapshots/COMMIT/  (links into ../../blobs)
//	HUB/models--ORG--NAME/blobs/HASH
//
// HUB is $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub.

// defaultHFHub returns the hub cache directory huggingface_hub uses.
func (e *env) defaultHFHub() string {
	if d := e.getenv("HF_HUB_CACHE"); d != "" {
		return d
	}
	if d := e.getenv("HF_HOME"); d != "" {
		return filepath.Join(d, "hub")
	}
	home := e.getenv("HOME")
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	return filepath.Join(home, ".cache", "huggingface", "hub")
}

var commitHash = regexp.MustCompile(`^[0-9a-f]{40}$`)

// hfSnapshot finds the snapshot directory of model repo (ORG/NAME, with an
// optional @REVISION: a branch, a tag or a commit hash; default main) in
// the hub cache hub.
func hfSnapshot(hub, repo string) (string, error) {
	id, rev, _ := strings.Cut(repo, "@")
	if rev == "" {
		rev = "main"
	}
	org, name, ok := strings.Cut(id, "/")
	if !ok || org == "" || name == "" || strings.Contains(name, "/") || strings.Contains(id, "..") {
		return "", fmt.Errorf("import --hf-cache: %q is not a model id: want ORG/NAME[@REVISION], as on the Hub", repo)
	}
	dir := filepath.Join(hub, "models--"+org+"--"+name)
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("import --hf-cache: %s is not in the Hugging Face cache %s (%v); download it first (huggingface-cli download %s) or name the cache with --hf-cache-dir", id, hub, err, id)
	}
	commit := rev
	if !commitHash.MatchString(rev) {
		b, err := os.ReadFile(filepath.Join(dir, "refs", filepath.Base(rev)))
		if err != nil || rev != filepath.Base(rev) {
			return "", fmt.Errorf("import --hf-cache: %s has no revision %q in %s; it has: %s", id, rev, hub, hfRevisions(dir))
		}
		commit = strings.TrimSpace(string(b))
	}
	snap := filepath.Join(dir, "snapshots", commit)
	if st, err := os.Stat(snap); err != nil || !st.IsDir() {
		return "", fmt.Errorf("import --hf-cache: %s@%s: no snapshot %s in the cache; it has: %s", id, rev, commit, hfRevisions(dir))
	}
	return snap, nil
}

// hfRevisions lists the refs and snapshots of a cached repo, for errors.
func hfRevisions(dir string) string {
	var out []string
	for _, sub := range []string{"refs", "snapshots"} {
		ents, _ := os.ReadDir(filepath.Join(dir, sub))
		for _, e := range ents {
			out = append(out, e.Name())
		}
	}
	if len(out) == 0 {
		return "nothing"
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

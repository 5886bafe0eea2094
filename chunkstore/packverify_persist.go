package chunkstore

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
)

// The record of checked packs is kept in DATA/verified-packs.json (0600)
// with the kernel's boot id, so that a node restarted within one boot does
// not hash again the packs it checked (warm, that hash is CPU-bound: about
// 1 s per GiB on the 2-core CPU machine, docs/bench.md), while a reboot —
// after which the page cache is empty, the first read disk-bound and the
// hash nearly free — checks everything again. A pack's identity (device,
// inode, size, mtime, ctime) still has to match: any write to a pack since
// its check, before or after the restart, means a new check. Only passed
// checks are kept; whoever can write this file can write the packs too
// (both are the node's, mode 0600 in a 0700 directory).

// bootIDPath is where the kernel's boot id is read (a variable for tests).
var bootIDPath = "/proc/sys/kernel/random/boot_id"

const verifiedFile = "verified-packs.json"

type persistedChecks struct {
	BootID string       `json:"boot_id"`
	Checks []*PackCheck `json:"checks"`
}

func bootID() string {
	b, err := os.ReadFile(bootIDPath)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// loadChecks reads the persisted record once, if it is from this boot.
// Caller holds v.mu.
func (s *Store) loadChecksLocked() {
	v := &s.pverify
	if v.loaded {
		return
	}
	v.loaded = true
	if v.recs == nil {
		v.recs = map[packFileKey]*PackCheck{}
	}
	boot := bootID()
	b, err := os.ReadFile(filepath.Join(s.dir, verifiedFile))
	if err != nil || boot == "" {
		return
	}
	var p persistedChecks
	if json.Unmarshal(b, &p) != nil || p.BootID != boot {
		return
	}
	for _, c := range p.Checks {
		if c != nil && c.OK() {
			v.recs[packFileKey{c.Pack, c.File}] = c
		}
	}
}

// saveChecks writes the passed checks (atomically: temporary file, rename).
func (s *Store) saveChecks() {
	boot := bootID()
	if boot == "" {
		return
	}
	v := &s.pverify
	v.saveMu.Lock()
	defer v.saveMu.Unlock()
	p := persistedChecks{BootID: boot}
	v.mu.Lock()
	for _, c := range v.recs {
		if c.OK() {
			p.Checks = append(p.Checks, c)
		}
	}
	v.mu.Unlock()
	b, err := json.Marshal(p)
	if err != nil {
		return
	}
	path := filepath.Join(s.dir, verifiedFile)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		s.log.Warn("cannot save the record of checked packs; a restart checks them again", "err", err)
		return
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		s.log.Warn("cannot save the record of checked packs; a restart checks them again", "err", err)
	}
}

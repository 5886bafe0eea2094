package chunkstore

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
)

// The record of checked packs is kept in DATA/verified-packs.json (0600)
// with the kernel's boot id, so that a node restarted within one boot does
// not hash again the packs it checked (warm, that hash is CPU-bound: about
// 1.7 s per GiB on the loaded 2-core CPU machine, docs/bench.md), while a
// reboot — after which the page cache is empty, the first read disk-bound
// and the hash nearly free — checks everything again. A pack's identity
// (device, inode, size, mtime, ctime) still has to match: any write to a
// pack since its check, before or after the restart, means a new check.
// Whoever can write this file can write the packs too (both are the
// node's, in its private data directory).
//
// The file is a log: a header line with the boot id, then one line per
// check (a failed check cancels the pack's earlier pass). Appending keeps
// the cost of a check constant for a node that checks thousands of packs;
// the log is rewritten when it holds more than twice the live entries, and
// a line torn by a crash is skipped.

// bootIDPath is where the kernel's boot id is read (a variable for tests).
var bootIDPath = "/proc/sys/kernel/random/boot_id"

const verifiedFile = "verified-packs.json"

type checksHeader struct {
	BootID string `json:"boot_id"`
}

func bootID() string {
	b, err := os.ReadFile(bootIDPath)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// loadChecksLocked reads the persisted record once, if it is from this
// boot. Caller holds v.mu.
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
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	var h checksHeader
	if !sc.Scan() || json.Unmarshal(sc.Bytes(), &h) != nil || h.BootID != boot {
		return
	}
	for sc.Scan() {
		var c PackCheck
		if json.Unmarshal(sc.Bytes(), &c) != nil {
			continue // torn by a crash
		}
		v.logLines++
		k := packFileKey{c.Pack, c.File}
		if c.OK() {
			v.recs[k] = &c
		} else {
			delete(v.recs, k)
		}
	}
	if len(b) > 0 && b[len(b)-1] == '\n' {
		v.logBoot = boot // else a torn line: the next save rewrites the file
	}
}

// persistCheck appends c to the record (a failed check cancels the pack's
// earlier pass), or rewrites the record when it is from another boot or
// mostly stale lines.
func (s *Store) persistCheck(c *PackCheck) {
	boot := bootID()
	if boot == "" {
		return
	}
	v := &s.pverify
	v.saveMu.Lock()
	defer v.saveMu.Unlock()
	v.mu.Lock()
	rewrite := v.logBoot != boot || v.logLines > 2*len(v.recs)+64
	var live []*PackCheck
	if rewrite {
		for _, r := range v.recs {
			if r.OK() {
				live = append(live, r)
			}
		}
	}
	v.mu.Unlock()
	path := filepath.Join(s.dir, verifiedFile)
	if !rewrite {
		line, err := json.Marshal(c)
		if err != nil {
			return
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0o600)
		if err == nil {
			_, err = f.Write(append(line, '\n'))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err == nil {
			v.mu.Lock()
			v.logLines++
			v.mu.Unlock()
			return
		}
		// The file went away or cannot be appended to: write it whole.
	}
	var buf bytes.Buffer
	hdr, _ := json.Marshal(checksHeader{BootID: boot})
	buf.Write(append(hdr, '\n'))
	for _, r := range live {
		line, _ := json.Marshal(r)
		buf.Write(append(line, '\n'))
	}
	if !rewrite { // the append failed: the live set includes c already
		v.mu.Lock()
		for _, r := range v.recs {
			if r.OK() {
				line, _ := json.Marshal(r)
				buf.Write(append(line, '\n'))
				live = append(live, r)
			}
		}
		v.mu.Unlock()
	}
	tmp := path + ".tmp"
	err := os.WriteFile(tmp, buf.Bytes(), 0o600)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		s.log.Warn("cannot save the record of checked packs; a restart checks them again", "err", err)
		return
	}
	v.mu.Lock()
	v.logBoot, v.logLines = boot, len(live)
	v.mu.Unlock()
}

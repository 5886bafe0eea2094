package chunkstore

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Policies of the cluster by namespace path (docs/design/erasure.md,
// "Tiers": k per path). A policy is kept in the namespace itself, under a
// directory of the root that is reserved and hidden like the rank layouts:
// PolicyDir/<kind>/<escaped path>, one entry per path. So the namespace
// merge spreads it to every member, two members setting different paths
// at once both keep theirs (the merge is per name), the later write wins
// for the same path, and a removal is a tombstone that merges like any.
//
// The value is the entry's symlink target, a short text: it lives in the
// directory manifest, so a member knows it as soon as the merge brought
// the directory, with no chunk to fetch (a file's bytes may be on other
// members only). The store keeps the text as given and does not know what
// it means: the package that applies a kind checks it (peers, for
// PolicyColdShards).

// PolicyDir is the directory of policies in the namespace root. The name
// is reserved there (ReservedRoot).
const PolicyDir = ".kylix-policy"

// PolicyColdShards is the policy kind of k, the data shards of the cold
// tier's stripes, by path (kylix tier shards).
const PolicyColdShards = "cold-shards"

// maxPolicyValue bounds a policy's text.
const maxPolicyValue = 64

// SetPathPolicy sets policy kind's value for the files at and below the
// namespace path p ("" or "/": the whole namespace), replacing the value
// set there before. p need not exist (a policy for files to come); a path
// in a reserved directory is refused.
func (s *Store) SetPathPolicy(kind, p, value string) error {
	name, err := policyName(p)
	if err != nil {
		return err
	}
	if value == "" || len(value) > maxPolicyValue || strings.ContainsRune(value, 0) {
		return fmt.Errorf("policy %s of %s: a value of 1 to %d bytes without NUL, not %q: %w", kind, displayPath(p), maxPolicyValue, value, ErrInvalidPath)
	}
	return s.Update(func(tx *NSTx) error {
		d, err := tx.dir([]string{PolicyDir, kind}, true, true)
		if err != nil {
			return fmt.Errorf("policy %s of %s: %w", kind, displayPath(p), err)
		}
		if err := tx.dropConflicts(kind, name); err != nil {
			return err
		}
		now := time.Now().UnixNano()
		d.m.Put(Entry{Name: name, Kind: KindSymlink, Mode: 0o777, UID: uint32(os.Getuid()), GID: uint32(os.Getgid()),
			Target: value, Size: int64(len(value)), MTime: now, CTime: now, HLC: tx.hlc})
		delete(d.children, name)
		return nil
	})
}

// ClearPathPolicy removes policy kind's value at path p (a tombstone, so
// the removal merges too) and reports whether there was one.
func (s *Store) ClearPathPolicy(kind, p string) (bool, error) {
	name, err := policyName(p)
	if err != nil {
		return false, err
	}
	found := false
	err = s.Update(func(tx *NSTx) error {
		found = false
		err := tx.remove([]string{PolicyDir, kind, name}, false, "")
		switch {
		case err == nil:
			found = true
		case !errors.Is(err, ErrNotFound):
			return fmt.Errorf("policy %s of %s: %w", kind, displayPath(p), err)
		}
		return tx.dropConflicts(kind, name)
	})
	return found, err
}

// dropConflicts removes the conflict copies a merge kept beside policy
// entry name (two members set the same path at once: the later value won,
// the other was kept as NAME.conflict-HLC): a new value or a removal
// settles the path.
func (tx *NSTx) dropConflicts(kind, name string) error {
	d, err := tx.dir([]string{PolicyDir, kind}, false, false)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range d.m.Live() {
		if strings.HasPrefix(e.Name, name+".conflict-") {
			if err := tx.remove([]string{PolicyDir, kind, e.Name}, false, ""); err != nil {
				return err
			}
		}
	}
	return nil
}

// PathPolicies returns policy kind's values by namespace path ("" for the
// whole namespace), as the current namespace holds them. Entries that are
// not a policy's (a merge's conflict copy, a name not escaped as
// SetPathPolicy escapes) are left out.
func (s *Store) PathPolicies(kind string) (map[string]string, error) {
	pd, err := s.reservedDir(PolicyDir)
	if err != nil || pd == nil {
		return nil, err
	}
	i, ok := pd.Find(kind)
	if !ok || pd.Entries[i].Deleted || pd.Entries[i].Kind != KindDir {
		return nil, nil
	}
	d, err := s.dirAt(pd.Entries[i].ID)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", kind, err)
	}
	out := map[string]string{}
	for _, e := range d.Live() {
		p, ok := unescapePolicyName(e.Name)
		if ok && e.Kind == KindSymlink {
			out[p] = e.Target
		}
	}
	return out, nil
}

// displayPath is namespace path p as messages show it ("/" for the root).
func displayPath(p string) string {
	return "/" + strings.Trim(p, "/")
}

// policyName is the entry name of the policy of namespace path p: p
// cleaned, without leading slash, with every byte other than a letter, a
// digit, '_' and '-' written %XX (so "models/narrow" is
// "models%2Fnarrow"); the whole namespace is "%2F". No policy name has a
// '.', which tells a merge's conflict copies (NAME.conflict-HLC) apart.
func policyName(p string) (string, error) {
	parts, err := SplitPath(p)
	if err != nil {
		return "", fmt.Errorf("policy path: %w", err)
	}
	if len(parts) > 0 && ReservedRoot(parts[0]) {
		return "", fmt.Errorf("policy path %s: the name %s is reserved in the namespace root: %w", displayPath(p), parts[0], ErrInvalidPath)
	}
	name := escapePolicyPath(strings.Join(parts, "/"))
	if len(name) > MaxNameLen {
		return "", fmt.Errorf("policy path %s: %d bytes once escaped, at most %d are kept: %w", displayPath(p), len(name), MaxNameLen, ErrInvalidPath)
	}
	return name, nil
}

func escapePolicyPath(p string) string {
	if p == "" {
		return "%2F"
	}
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		c := p[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// unescapePolicyName is policyName's inverse: false for a name that
// policyName would not have made.
func unescapePolicyName(name string) (string, bool) {
	if name == "%2F" {
		return "", true
	}
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		if name[i] != '%' {
			b.WriteByte(name[i])
			continue
		}
		if i+2 >= len(name) {
			return "", false
		}
		c, err := strconv.ParseUint(name[i+1:i+3], 16, 8)
		if err != nil {
			return "", false
		}
		b.WriteByte(byte(c))
		i += 2
	}
	p := b.String()
	if escapePolicyPath(p) != name {
		return "", false
	}
	if clean, err := CleanPath(p); err != nil || clean != p || p == "" {
		return "", false
	}
	return p, true
}

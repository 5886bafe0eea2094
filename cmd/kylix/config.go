package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/BurntSushi/toml"
	"github.com/spf13/pflag"

	"github.com/kylix/kylix/peers"
)

// configEnv names the variable giving serve's config file when --config
// is not given.
const configEnv = "KYLIX_CONFIG"

// configPathKeys are the keys whose value is a path: relative, it is taken
// from the config file's directory, not from where serve was started.
var configPathKeys = map[string]bool{"data": true, "mount": true, "cluster-key": true, "client-socket": true}

// configNotSettable are flags a config file may not set.
var configNotSettable = map[string]string{
	"config": "a config file cannot name another",
	"help":   "help is for the command line",
}

// applyConfig reads the TOML file at path and sets each flag of f named by
// one of its keys, unless the command line set it already: the command
// line wins over the file, and the file over the defaults (environment
// variables such as KYLIX_DATA included). Keys are the flags' names (data,
// listen, join, cluster-key, ...), all at the top level. A key that names
// no flag, a value of the wrong type and a value the flag refuses are
// errors naming the file and the key: a typo is never silently ignored.
// It returns the names of the flags the file set.
func applyConfig(f *flags, path string) ([]string, error) {
	text, err := readConfigFile(path)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if _, err := toml.Decode(string(text), &m); err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("config %s: line %d: %s", path, pe.Position.Line, pe.Message)
		}
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var set []string
	for _, k := range keys {
		fl := f.Lookup(k)
		if why, no := configNotSettable[k]; no {
			return nil, fmt.Errorf("config %s: key %q cannot be set in a config file (%s)", path, k, why)
		}
		if fl == nil {
			return nil, fmt.Errorf("config %s: unknown key %q%s (the keys are the flags of kylix %s, without the dashes: kylix %s --help)",
				path, k, suggestKey(f, k), f.Name(), f.Name())
		}
		if fl.Changed {
			continue // the command line wins
		}
		v, err := configValue(fl, m[k])
		if err != nil {
			return nil, fmt.Errorf("config %s: key %q: %w", path, k, err)
		}
		if k == "cluster-key" {
			if _, err := peers.ParseKey(v); err == nil {
				return nil, fmt.Errorf("config %s: key \"cluster-key\" holds a key; it names the file holding it (kylix cluster-key > FILE; chmod 600 FILE), so the key stays out of the config", path)
			}
		}
		if configPathKeys[k] && v != "" && !(k == "client-socket" && v == "none") && !filepath.IsAbs(v) {
			v = filepath.Join(filepath.Dir(path), v)
		}
		if err := fl.Value.Set(v); err != nil {
			return nil, fmt.Errorf("config %s: key %q: %w", path, k, err)
		}
		set = append(set, k)
	}
	return set, nil
}

// configValue turns a TOML value into the flag's text, checking its type:
// booleans for boolean flags, integers for integer flags, strings for the
// rest (an integer is taken for a string too: peer-cache = 0), and, for
// join and the list flags (cold-shards), a list of strings.
func configValue(fl *pflag.Flag, v any) (string, error) {
	switch typ := fl.Value.Type(); typ {
	case "bool":
		b, ok := v.(bool)
		if !ok {
			return "", fmt.Errorf("want true or false, got %s", tomlType(v))
		}
		return strconv.FormatBool(b), nil
	case "int", "int64", "int32", "uint", "uint64", "uint32":
		i, ok := v.(int64)
		if !ok {
			return "", fmt.Errorf("want an integer, got %s", tomlType(v))
		}
		return strconv.FormatInt(i, 10), nil
	case "duration":
		s, ok := v.(string)
		if !ok {
			return "", fmt.Errorf("want a duration in quotes (\"30s\", \"2m\"), got %s", tomlType(v))
		}
		return s, nil
	default:
		switch x := v.(type) {
		case string:
			return x, nil
		case int64:
			return strconv.FormatInt(x, 10), nil
		case []any:
			if fl.Name != "join" && typ != "stringSlice" {
				break
			}
			var ss []string
			for _, e := range x {
				s, ok := e.(string)
				if !ok {
					if fl.Name == "join" {
						return "", fmt.Errorf("want a list of \"HOST:PORT\" strings, got %s in it", tomlType(e))
					}
					return "", fmt.Errorf("want a list of strings, got %s in it", tomlType(e))
				}
				ss = append(ss, s)
			}
			return strings.Join(ss, ","), nil
		}
		if fl.Name == "join" {
			return "", fmt.Errorf("want \"HOST:PORT\" or a list of them, got %s", tomlType(v))
		}
		return "", fmt.Errorf("want a string, got %s", tomlType(v))
	}
}

// tomlType names a decoded TOML value's type for an error.
func tomlType(v any) string {
	switch x := v.(type) {
	case string:
		return fmt.Sprintf("the string %q", x)
	case int64:
		return fmt.Sprintf("the integer %d", x)
	case float64:
		return fmt.Sprintf("the number %v", x)
	case bool:
		return fmt.Sprintf("%v", x)
	case []any:
		return "a list"
	case map[string]any:
		return "a table"
	}
	return fmt.Sprintf("a %T", v)
}

// readConfigFile reads the config file at path after checking who may
// change it: whoever can write it chooses the node's data directory, mount
// and key file. It is refused when every user may write it. For a node run
// as root it is also refused when its group may write it or another user
// owns it, and when a directory on its path (as given and, through
// symlinks, as resolved) is writable by group or others without the sticky
// bit, or owned by another user: such a directory lets its writer rename
// another file into the config's place. The bytes returned are read from
// the descriptor that was checked, so a swap after the check is not read.
func readConfigFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	if st.IsDir() {
		return nil, fmt.Errorf("config file %s is a directory", path)
	}
	root := os.Geteuid() == 0
	perm := st.Mode().Perm()
	switch {
	case perm&0o002 != 0:
		return nil, fmt.Errorf("config file %s is writable by every user (mode %04o): chmod o-w it", path, perm)
	case root && perm&0o020 != 0:
		return nil, fmt.Errorf("config file %s is writable by its group (mode %04o), and the node runs as root: chmod go-w it", path, perm)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && root && sys.Uid != 0 {
		return nil, fmt.Errorf("config file %s belongs to uid %d, and the node runs as root: chown root it", path, sys.Uid)
	}
	if root {
		if err := checkConfigDirs(path); err != nil {
			return nil, err
		}
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return b, nil
}

// checkConfigDirs checks, for a node run as root, every directory from the
// config file's up to / on its path as given and on its resolved path.
func checkConfigDirs(path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	seen := map[string]bool{}
	for _, p := range []string{abs, real} {
		for d := filepath.Dir(p); !seen[d]; d = filepath.Dir(d) {
			seen[d] = true
			st, err := os.Stat(d)
			if err != nil {
				return fmt.Errorf("config directory: %w", err)
			}
			perm := st.Mode() & (os.ModePerm | os.ModeSticky)
			if perm&0o022 != 0 && perm&os.ModeSticky == 0 {
				return fmt.Errorf("config directory %s is writable by group or others (mode %04o) and not sticky, and the node runs as root: whoever may write it can replace the config file: chmod go-w it",
					d, st.Mode().Perm())
			}
			if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Uid != 0 {
				return fmt.Errorf("config directory %s belongs to uid %d, and the node runs as root: chown root it", d, sys.Uid)
			}
			if d == "/" {
				break
			}
		}
	}
	return nil
}

// suggestKey returns `; did you mean "K"?` for the flag of f whose name
// is nearest to k (nearestFlag), if one is near enough.
func suggestKey(f *flags, k string) string {
	best := nearestFlag(f.FlagSet, k, func(fl *pflag.Flag) bool {
		_, no := configNotSettable[fl.Name]
		return no
	})
	if best == "" {
		return ""
	}
	return fmt.Sprintf("; did you mean %q?", best)
}

// editDistance is the Levenshtein distance between a and b; "_" and "-"
// count as the same (cluster_key for cluster-key).
func editDistance(a, b string) int {
	a, b = strings.ReplaceAll(a, "_", "-"), strings.ReplaceAll(b, "_", "-")
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := prev[j-1]
			if a[i-1] != b[j-1] {
				c++
			}
			cur[j] = min(c, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// configPath is the config file serve reads: --config, else $KYLIX_CONFIG,
// else none.
func configPath(f *flags, flagValue string) string {
	if f.Changed("config") {
		return flagValue
	}
	return f.e.getenv(configEnv)
}

package cuda

import (
	"encoding/json"
	"os"
)

// cuFileConfig is what CuFileStatus takes from cufile.json (the file named
// by CUFILE_ENV_PATH_JSON, else /etc/cufile.json). The library's own view,
// through cuFileGetParameterBool, wins where the library offers it.
type cuFileConfig struct {
	path        string
	allowCompat bool // properties.allow_compat_mode (cuFile's default: true)
	p2pdma      bool // properties.use_pci_p2pdma (default: false)
	forceCompat bool // properties.force_compat_mode (default: false)
	err         error
}

func readCuFileConfig() cuFileConfig {
	c := cuFileConfig{path: "/etc/cufile.json", allowCompat: true}
	if p := os.Getenv("CUFILE_ENV_PATH_JSON"); p != "" {
		c.path = p
	}
	b, err := os.ReadFile(c.path)
	if err != nil {
		c.err = err
		return c
	}
	var f struct {
		Properties struct {
			AllowCompatMode *bool `json:"allow_compat_mode"`
			UsePCIP2PDMA    *bool `json:"use_pci_p2pdma"`
			ForceCompatMode *bool `json:"force_compat_mode"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(stripJSONComments(b), &f); err != nil {
		c.err = err
		return c
	}
	if v := f.Properties.AllowCompatMode; v != nil {
		c.allowCompat = *v
	}
	if v := f.Properties.UsePCIP2PDMA; v != nil {
		c.p2pdma = *v
	}
	if v := f.Properties.ForceCompatMode; v != nil {
		c.forceCompat = *v
	}
	return c
}

// stripJSONComments removes // and /* */ comments (cufile.json has them)
// outside string literals, and trailing commas before } or ].
func stripJSONComments(b []byte) []byte {
	out := make([]byte, 0, len(b))
	inStr, esc := false, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inStr {
			out = append(out, c)
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
			continue
		}
		switch {
		case c == '"':
			inStr = true
			out = append(out, c)
		case c == '/' && i+1 < len(b) && b[i+1] == '/':
			for i < len(b) && b[i] != '\n' {
				i++
			}
			if i < len(b) {
				out = append(out, '\n')
			}
		case c == '/' && i+1 < len(b) && b[i+1] == '*':
			i += 2
			for i+1 < len(b) && !(b[i] == '*' && b[i+1] == '/') {
				i++
			}
			i++ // at '/'
		case c == '}' || c == ']':
			// drop a trailing comma: ",   }" -> "   }"
			j := len(out) - 1
			for j >= 0 && (out[j] == ' ' || out[j] == '\t' || out[j] == '\n' || out[j] == '\r') {
				j--
			}
			if j >= 0 && out[j] == ',' {
				out = append(out[:j], out[j+1:]...)
			}
			out = append(out, c)
		default:
			out = append(out, c)
		}
	}
	return out
}

package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

func init() {
	register(&command{name: "version", summary: "print the version of kylix and how it was built", run: runVersion})
}

// version is the release version, set at build time:
//
//	go build -ldflags "-X main.version=v1.2.3" ./cmd/kylix
//	make build LDFLAGS="-X main.version=v1.2.3"
//
// Left empty, the version comes from the build information Go records
// (the module version of go install MODULE@VERSION, else the VCS revision).
var version string

type versionInfo struct {
	Version  string `json:"version"`
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	Go       string `json:"go"`
	Platform string `json:"platform"`
}

// buildVersion reads the version: -ldflags first, then debug.BuildInfo.
func buildVersion() versionInfo {
	v := versionInfo{Version: version, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if ok {
		if v.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Revision = s.Value
			case "vcs.time":
				v.Time = s.Value
			case "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
	}
	if v.Version == "" {
		v.Version = "devel"
	}
	return v
}

// String is the one line kylix --version prints after "kylix ".
func (v versionInfo) String() string {
	var extra []string
	if v.Revision != "" && !strings.Contains(v.Version, shortRev(v.Revision)) {
		r := shortRev(v.Revision)
		if v.Modified {
			r += "+dirty"
		}
		extra = append(extra, r)
	}
	extra = append(extra, v.Go, v.Platform)
	return fmt.Sprintf("%s (%s)", v.Version, strings.Join(extra, ", "))
}

func shortRev(r string) string { return r[:min(12, len(r))] }

func runVersion(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "version", "[--json]", `
Prints the version of kylix (the release set at build time with
-ldflags "-X main.version=VERSION", else the module version or VCS revision
Go recorded), the Go version it was built with, and the platform.
Same as kylix --version.`).withJSON()
	f.MarkHidden("data")
	if err := f.parse(args, 0, 0); err != nil {
		return err
	}
	v := buildVersion()
	if f.jsonOut {
		return f.printJSON(v)
	}
	_, err := fmt.Fprintf(e.stdout, "kylix %s\n", v)
	return err
}

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

// version, revision, buildTime and modified are set at build time:
//
//	go build -ldflags "-X main.version=v1.2.3" ./cmd/kylix
//	make build        (scripts/version.sh: the tag, else a pseudo-version, from git)
//
// Where they are empty, they come from the build information Go records:
// the module version of go install MODULE@VERSION, or the one go build
// derives from the VCS (a tag, else v0.0.0-DATE-COMMIT), and the VCS
// revision, time and modified flag. Go records no VCS information under
// GOFLAGS=-buildvcs=false or outside a git checkout (a tarball): the
// Makefile's -X flags fill it in.
var version, revision, buildTime, modified string

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
	v := versionInfo{Version: version, Revision: revision, Time: buildTime, Modified: modified == "true",
		Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if ok {
		if v.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v.Version = bi.Main.Version
		}
		vcs := map[string]string{}
		for _, s := range bi.Settings {
			vcs[s.Key] = s.Value
		}
		if r := vcs["vcs.revision"]; r != "" && v.Revision == "" {
			v.Revision, v.Time, v.Modified = r, vcs["vcs.time"], vcs["vcs.modified"] == "true"
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
	switch {
	case v.Revision == "":
		extra = append(extra, "revision unknown")
	case !strings.Contains(v.Version, shortRev(v.Revision)):
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
Prints the version of kylix (the release tag, else a pseudo-version
v0.0.0-DATE-COMMIT, set by make build or -ldflags "-X main.version=VERSION",
else the module version Go recorded), the commit it was built from, the Go
version it was built with, and the platform. "devel (revision unknown, ...)":
built without git and without make build's stamp.
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

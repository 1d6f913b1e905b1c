package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
)

// versionInfo is what `pgratelimit version` prints: the CLI module's
// version and the VCS revision it was built from, as the Go toolchain
// recorded them (runtime/debug.ReadBuildInfo).
type versionInfo struct {
	// Version is the module version ("v0.1.0"), or "(devel)" for a build
	// from a checkout (go build, go run), which has none.
	Version string `json:"version"`
	// Revision and Time are the commit built (from a checkout with its VCS
	// information; empty otherwise), and Modified says the work tree had
	// changes not committed.
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	// Go is the toolchain that built it.
	Go string `json:"go"`
}

// readVersion reads the binary's build information; ok is false when it
// has none (a binary built without module support).
func readVersion(read func() (*debug.BuildInfo, bool)) versionInfo {
	v := versionInfo{Version: "(devel)", Go: runtime.Version()}
	bi, ok := read()
	if !ok {
		return v
	}
	if bi.Main.Version != "" {
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
	return v
}

// String is the version for people: "pgratelimit v0.1.0 (go1.26.0)", or
// "pgratelimit (devel) 0123abcd4567 2026-11-27T08:00:00Z, modified (go1.26.0)".
func (v versionInfo) String() string {
	s := "pgratelimit " + v.Version
	if v.Revision != "" {
		rev := v.Revision
		if len(rev) > 12 {
			rev = rev[:12]
		}
		s += " " + rev
		if v.Time != "" {
			s += " " + v.Time
		}
		if v.Modified {
			s += ", modified"
		}
	}
	return s + " (" + v.Go + ")"
}

func runVersion(_ context.Context, c *cli, args []string) int {
	cmd, _ := lookupCommand("version")
	f := newFlagSet(c, cmd)
	f.BoolVar(&f.json, "json", false, "print JSON instead of text")
	if _, err := f.parse(args, 0, 0); err != nil {
		return f.fail(err)
	}
	v := readVersion(debug.ReadBuildInfo)
	if f.json {
		f.printJSON(v)
	} else {
		fmt.Fprintln(c.stdout, v)
	}
	return exitOK
}

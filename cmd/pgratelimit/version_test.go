package main

import (
	"encoding/json"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestVersion(t *testing.T) {
	t.Parallel()
	released := func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{Main: debug.Module{Path: "github.com/pgratelimit/pgratelimit/cmd/pgratelimit", Version: "v0.1.0"}}, true
	}
	v := readVersion(released)
	require.Equal(t, versionInfo{Version: "v0.1.0", Go: runtime.Version()}, v)
	require.Equal(t, "pgratelimit v0.1.0 ("+runtime.Version()+")", v.String())

	checkout := func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
			{Key: "vcs.time", Value: "2026-11-27T08:00:00Z"},
			{Key: "vcs.modified", Value: "true"},
		}}, true
	}
	v = readVersion(checkout)
	require.Equal(t, "(devel)", v.Version)
	require.Equal(t, "0123456789abcdef0123456789abcdef01234567", v.Revision)
	require.True(t, v.Modified)
	require.Equal(t, "pgratelimit (devel) 0123456789ab 2026-11-27T08:00:00Z, modified ("+runtime.Version()+")", v.String())

	none := func() (*debug.BuildInfo, bool) { return nil, false }
	require.Equal(t, versionInfo{Version: "(devel)", Go: runtime.Version()}, readVersion(none))
	empty := func() (*debug.BuildInfo, bool) { return &debug.BuildInfo{}, true }
	require.Equal(t, "(devel)", readVersion(empty).Version)

	// The command prints this binary's: a test binary is "(devel)" or has
	// a version, always with its Go.
	code, out, stderr := pgrl("", "version")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^pgratelimit \S+.* \(go[^)]+\)\n$`, out)
	code, out, _ = pgrl("", "version", "--json")
	require.Equal(t, 0, code)
	var got versionInfo
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.Equal(t, readVersion(debug.ReadBuildInfo), got)
	code, _, stderr = pgrl("", "version", "extra")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `unexpected argument "extra"`)
}

// Command publish puts one version of a module into a module proxy laid out
// on disk (GOPROXY=file://DIR), as a release would put it on a real proxy:
// DIR/<module path>/@v/<version>.mod, .zip, .info, and the version added to
// DIR/<module path>/@v/list. The zip holds the module's directory as Go
// builds it (golang.org/x/mod/zip: no nested modules, no VCS directories).
//
// Usage (from this directory, which is a module of its own so that the
// library does not require golang.org/x/mod):
//
//	GOWORK=off go run . PROXYDIR MODULEDIR VERSION
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/zip"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: publish PROXYDIR MODULEDIR VERSION")
		os.Exit(2)
	}
	if err := publish(os.Args[1], os.Args[2], os.Args[3]); err != nil {
		fmt.Fprintln(os.Stderr, "publish:", err)
		os.Exit(1)
	}
}

func publish(proxyDir, modDir, version string) error {
	if !semver.IsValid(version) || semver.Canonical(version) != version {
		return fmt.Errorf("version %q is not a canonical semantic version (vX.Y.Z)", version)
	}
	goMod, err := os.ReadFile(filepath.Join(modDir, "go.mod"))
	if err != nil {
		return err
	}
	path := modfile.ModulePath(goMod)
	if path == "" {
		return fmt.Errorf("%s/go.mod has no module line", modDir)
	}
	m := module.Version{Path: path, Version: version}
	if err := module.Check(path, version); err != nil {
		return err
	}
	escaped, err := module.EscapePath(path)
	if err != nil {
		return err
	}
	dir := filepath.Join(proxyDir, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}

	var z bytes.Buffer
	if err := zip.CreateFromDir(&z, m, modDir); err != nil {
		return fmt.Errorf("zipping %s: %w", m, err)
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return err
	}
	for ext, data := range map[string][]byte{".mod": goMod, ".zip": z.Bytes(), ".info": info} {
		if err := os.WriteFile(filepath.Join(dir, version+ext), data, 0o644); err != nil {
			return err
		}
	}

	listFile := filepath.Join(dir, "list")
	list, err := os.ReadFile(listFile)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	versions := strings.Fields(string(list))
	if !slices.Contains(versions, version) {
		versions = append(versions, version)
	}
	semver.Sort(versions)
	if err := os.WriteFile(listFile, []byte(strings.Join(versions, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	fmt.Printf("published %s (%d bytes zipped)\n", m, z.Len())
	return nil
}

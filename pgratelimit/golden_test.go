package pgratelimit

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// Every SQL text of the statement sets, the Citus ones included (which the
// integration suite's golden run, on plain PostgreSQL, does not send), byte
// for byte: a change of the library's layout must not change them.
func TestGoldenSQL(t *testing.T) {
	var b strings.Builder
	dump := func(name string, st sqlgen.Statements) {
		for _, part := range []struct {
			name string
			ts   sqlgen.Table
		}{{"one", st.One}, {"many", st.Many}, {"citus", st.Citus}, {"one.data", *st.One.Data}, {"many.data", *st.Many.Data}, {"citus.data", *st.Citus.Data}} {
			ts := part.ts
			for _, f := range []struct{ n, sql string }{
				{"insert", ts.Insert}, {"guardedInsert", ts.GuardedInsert}, {"lock", ts.Lock}, {"lockSkip", ts.LockSkip},
				{"relock", ts.Relock}, {"update", ts.Update}, {"lockGrants", ts.LockGrants}, {"lockSkipGrants", ts.LockSkipGrants},
				{"relockGrants", ts.RelockGrants}, {"updateData", ts.UpdateData},
			} {
				if f.sql != "" {
					fmt.Fprintf(&b, "== %s.%s.%s\n%s\n", name, part.name, f.n, f.sql)
				}
			}
		}
		fmt.Fprintf(&b, "== %s.peek\n%s\n== %s.remove\n%s\n", name, st.Peek, name, st.Remove)
	}
	dump("durable", *Durable.statements())
	overrides := func(name string, st sqlgen.Statements) {
		for _, part := range []struct {
			name string
			ts   *sqlgen.Table
		}{{"one.overrides", st.One.Overrides}, {"many.overrides", st.Many.Overrides}, {"one.data.overrides", st.One.Data.Overrides}, {"many.data.overrides", st.Many.Data.Overrides}} {
			for _, f := range []struct{ n, sql string }{
				{"insert", part.ts.Insert}, {"lock", part.ts.Lock}, {"lockSkip", part.ts.LockSkip}, {"relock", part.ts.Relock},
				{"lockGrants", part.ts.LockGrants}, {"lockSkipGrants", part.ts.LockSkipGrants}, {"relockGrants", part.ts.RelockGrants},
			} {
				fmt.Fprintf(&b, "== %s.%s.%s\n%s\n", name, part.name, f.n, f.sql)
			}
		}
	}
	dump("ephemeral", *Ephemeral.statements())
	dump("routed shard", sqlgen.Buckets(`"public"."pgratelimit_buckets_102008"`,
		`, (SELECT count(*) FROM pg_catalog.pg_dist_placement WHERE shardid = 102008 AND groupid = 2)`))
	for _, s := range (engine.Citus{}).Set([]string{"lock_timeout", "20ms", "synchronous_commit", "off"}) {
		fmt.Fprintf(&b, "== citus.set\n%s\n", s.SQL)
	}
	fmt.Fprintf(&b, "== grants.lockOne\n%s\n== grants.lockOneSkip\n%s\n", sqlgen.Grants.LockOne, sqlgen.Grants.LockOneSkip)
	for _, l := range []struct {
		name string
		ls   sqlgen.LeaseStatements
	}{{"leases", sqlgen.Leases}, {"ephemeral leases", sqlgen.EphemeralLeases}} {
		fmt.Fprintf(&b, "== %[1]s.list\n%[2]s\n", l.name, l.ls.List)
	}
	fmt.Fprintf(&b, "== leases.tokens\n%s\n", sqlgen.LeaseTokens)
	fmt.Fprintf(&b, "== notify.one\n%s\n== notify.many\n%s\n== notifyUnbounded.one\n%s\n== notifyUnbounded.many\n%s\n",
		sqlgen.Notify.One, sqlgen.Notify.Many, sqlgen.NotifyUnbounded.One, sqlgen.NotifyUnbounded.Many)
	fmt.Fprintf(&b, "== readClock\n%s\n", sqlgen.Clock)
	// The Overrides variants, after the rest (which they leave as they were).
	overrides("durable", *Durable.statements())
	overrides("ephemeral", *Ephemeral.statements())
	for _, st := range []struct {
		name string
		st   *sqlgen.Statements
	}{{"durable", Durable.statements()}, {"ephemeral", Ephemeral.statements()}} {
		fmt.Fprintf(&b, "== %[1]s.mark\n%[2]s\n== %[1]s.hold\n%[3]s\n", st.name, st.st.Mark, st.st.Hold)
	}
	fmt.Fprintf(&b, "== overrides.read\n%s\n== overrides.set\n%s\n== overrides.clear\n%s\n== overrides.list\n%s\n",
		sqlgen.Overrides.Read, sqlgen.Overrides.Set, sqlgen.Overrides.Clear, sqlgen.Overrides.List)
	fmt.Fprintf(&b, "== policies.record\n%s\n== policies.list\n%s\n", sqlgen.Policies.Record, sqlgen.Policies.List)
	for n := 1; n <= 6; n++ {
		fmt.Fprintf(&b, "== setConfig %d\n%s\n", n, sqlgen.SetConfig(n))
	}
	compareGolden(t, "sql.txt", b.String())
}

func compareGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("no golden file (go test -run %s -update): %v", t.Name(), err)
	}
	if string(want) != got {
		t.Fatalf("the SQL changed (go test -run %s -update rewrites %s); got:\n%s", t.Name(), path, got)
	}
}

package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
)

// acquireLine is acquire's line for a lease acquired: its ID first.
var acquireLine = regexp.MustCompile(`^(\S+)  acquired (\d+) units? of "([^"]+)" \(token (\d+)\): (\d+) of (\d+) held, expires in (\S+)\n$`)

// acquire, leases, extend and release, with their exit statuses and their
// lines, text and JSON: the lease ID first for scripts, a replay by request
// ID, a denial that says when to retry, releases of leases held, not held
// and expired.
func TestLeaseCommands(t *testing.T) {
	t.Parallel()
	url := testdb.NewSchema(t).URL(t)
	policy := []string{"--prefix", "exports", "--max", "2", "--ttl", "30s"}
	acquire := func(args ...string) (int, string, string) {
		return pgrl(url, append(append([]string{"acquire", "org-1"}, policy...), args...)...)
	}

	code, out, stderr := acquire()
	require.Equal(t, 0, code, stderr)
	m := acquireLine.FindStringSubmatch(out)
	require.NotNil(t, m, out)
	first := m[1]
	require.Equal(t, []string{"1", "org-1", "1", "2", "30s"}, []string{m[2], m[3], m[5], m[6], m[7]})

	// With a request ID: the ID is the lease's; a repeat is a replay.
	code, out, _ = acquire("--request-id", "job-7")
	require.Equal(t, 0, code)
	m = acquireLine.FindStringSubmatch(out)
	require.NotNil(t, m, out)
	require.Equal(t, "job-7", m[1])
	token := m[4]
	code, out, _ = acquire("--request-id", "job-7")
	require.Equal(t, 0, code, "a replay exits as the acquisition did")
	require.Regexp(t, `^job-7  replayed: request "job-7" already holds this lease, acquired at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+ \(nothing taken now\): 1 unit of "org-1" \(token `+token+`\): 2 of 2 held, expires in \S+\n$`, out)
	code, out, _ = acquire("--request-id", "job-7", "--json")
	require.Equal(t, 0, code)
	require.Contains(t, out, `"replayed":true`)
	code, out, stderr = acquire("--request-id", "job-7", "--weight", "2")
	require.Equal(t, 2, code)
	require.Empty(t, out)
	require.Equal(t, "pgratelimit acquire: request ID \"job-7\" holds a live lease of \"org-1\" of another weight, not 2: nothing taken (a new lease needs a new ID)\n", stderr)

	// Full: denied, exit 1, with what is held and when to retry.
	code, out, _ = acquire()
	require.Equal(t, 1, code)
	require.Regexp(t, `^denied: "org-1" has 2 of 2 units held, so not the 1 asked for \(nothing taken\); retry in (2[0-9]|30)s, when enough leases expire \(sooner if one is released; --wait waits\)\n$`, out)
	code, out, _ = acquire("--json")
	require.Equal(t, 1, code)
	var denied map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &denied))
	require.Equal(t, false, denied["acquired"])
	require.Equal(t, 2.0, denied["held"])
	require.Equal(t, 2.0, denied["limit"])
	require.InDelta(t, 30000, denied["retry_after_ms"], 10000)
	require.NotContains(t, denied, "id")

	checkLeasesListed(t, url, first)

	// Extend: the heartbeat.
	code, out, _ = pgrl(url, "extend", "org-1", "job-7", "--prefix", "exports", "--ttl", "1h")
	require.Equal(t, 0, code)
	require.Equal(t, "extended lease job-7 of \"org-1\" (1 unit, token "+token+"): expires in 1h\n", out)
	code, out, _ = pgrl(url, "extend", "org-1", "nope", "--prefix", "exports", "--ttl", "1h", "--json")
	require.Equal(t, 1, code)
	require.Equal(t, `{"key":"org-1","id":"nope","status":"not_held"}`+"\n", out)

	// Release: done, then not held (still exit 0).
	code, out, _ = pgrl(url, "release", "org-1", "job-7", "--prefix", "exports")
	require.Equal(t, 0, code)
	require.Equal(t, "released lease job-7 of \"org-1\" (1 unit, token "+token+"): free again\n", out)
	code, out, _ = pgrl(url, "release", "org-1", "job-7", "--prefix", "exports")
	require.Equal(t, 0, code)
	require.Equal(t, "lease job-7 of \"org-1\" is not held (released before, never acquired, or expired and cleaned up): nothing to release\n", out)
	code, out, _ = pgrl(url, "release", "org-1", first, "--prefix", "exports", "--max", "2", "--json")
	require.Equal(t, 0, code)
	var rel struct{ Status, ID string }
	require.NoError(t, json.Unmarshal([]byte(out), &rel))
	require.Equal(t, "released", rel.Status)
	require.Equal(t, first, rel.ID)
	code, out, _ = pgrl(url, "leases", "org-1", "--prefix", "exports")
	require.Equal(t, 0, code)
	require.Equal(t, "no live leases of \"org-1\" (prefix \"exports\")\n", out)

	// An ID that would split the line is quoted; --json gives it as it is.
	code, out, _ = acquire("--request-id", `a "b"`)
	require.Equal(t, 0, code)
	require.True(t, strings.HasPrefix(out, `"a \"b\""  acquired 1 unit of "org-1"`), out)
	code, out, _ = pgrl(url, "leases", "org-1", "--prefix", "exports", "--json")
	require.Equal(t, 0, code)
	require.Contains(t, out, `"id":"a \"b\""`)
	code, out, _ = pgrl(url, "release", "org-1", `a "b"`, "--prefix", "exports")
	require.Equal(t, 0, code)
	require.True(t, strings.HasPrefix(out, `released lease "a \"b\"" of "org-1"`), out)
}

// checkLeasesListed: leases lists the two live leases of org-1, oldest
// first, in text and JSON.
func checkLeasesListed(t *testing.T, url, first string) {
	t.Helper()
	code, out, _ := pgrl(url, "leases", "org-1", "--prefix", "exports", "--max", "2")
	require.Equal(t, 0, code)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 3, out)
	require.Equal(t, `"org-1": 2 live leases holding 2 units of 2 (prefix "exports"), oldest first:`, lines[0])
	require.Regexp(t, `^  `+first+`  weight 1  token \d+  acquired \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z  expires in (29|30)s$`, lines[1])
	require.Regexp(t, `^  job-7  weight 1  token \d+  acquired .+  expires in \S+$`, lines[2])

	code, out, _ = pgrl(url, "leases", "org-1", "--prefix", "exports", "--json")
	require.Equal(t, 0, code)
	var ls struct {
		Held   int64 `json:"held"`
		Limit  int64 `json:"limit"`
		Leases []struct {
			ID          string    `json:"id"`
			Weight      int64     `json:"weight"`
			Token       int64     `json:"token"`
			ExpiresAt   time.Time `json:"expires_at"`
			ExpiresInMS int64     `json:"expires_in_ms"`
		} `json:"leases"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &ls))
	require.Equal(t, int64(2), ls.Held)
	require.Zero(t, ls.Limit, "no --max: no limit")
	require.Len(t, ls.Leases, 2)
	require.Equal(t, first, ls.Leases[0].ID)
	require.Equal(t, "job-7", ls.Leases[1].ID)
	require.Less(t, ls.Leases[0].Token, ls.Leases[1].Token, "fencing tokens grow")
	require.InDelta(t, 30000, ls.Leases[0].ExpiresInMS, 10000)
}

// A lease past its TTL: release and extend say it expired (exit 1) for one
// TTL more; then it is forgotten, not held, before and after cleanup.
func TestLeaseExpired(t *testing.T) {
	t.Parallel()
	url := testdb.NewSchema(t).URL(t)
	const ttl = 2 * time.Second // time enough for three commands past it
	code, out, stderr := pgrl(url, "acquire", "k", "--max", "1", "--ttl", ttl.String(), "--storage", "ephemeral", "--json")
	require.Equal(t, 0, code, stderr)
	start := time.Now()
	var a struct {
		ID       string `json:"id"`
		Acquired bool   `json:"acquired"`
		Weight   int64  `json:"weight"`
		Token    int64  `json:"token"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &a))
	require.True(t, a.Acquired)
	require.NotEmpty(t, a.ID)
	require.Equal(t, int64(1), a.Weight)
	time.Sleep(ttl + 20*time.Millisecond)

	for _, args := range [][]string{{"release", "k", a.ID}, {"extend", "k", a.ID, "--ttl", "1s"}} {
		code, out, _ = pgrl(url, append(args, "--storage", "ephemeral")...)
		require.Equal(t, 1, code, "%v", args)
		require.Regexp(t, `^lease `+a.ID+` of "k" had expired: its units (were free already, and )?may be another's now`, out)
	}
	code, out, _ = pgrl(url, "release", "k", a.ID, "--storage", "ephemeral", "--json")
	require.Equal(t, 1, code)
	require.Equal(t, `{"key":"k","id":"`+a.ID+`","status":"expired"}`+"\n", out)
	code, out, _ = pgrl(url, "acquire", "k", "--max", "1", "--ttl", "1m", "--storage", "ephemeral")
	require.Equal(t, 0, code, "its unit is free: %s", out)

	time.Sleep(time.Until(start.Add(2*ttl + 20*time.Millisecond))) // forgotten now
	for range 2 {
		code, out, _ = pgrl(url, "release", "k", a.ID, "--storage", "ephemeral")
		require.Equal(t, 0, code)
		require.Contains(t, out, "is not held")
		code, out, _ = pgrl(url, "extend", "k", a.ID, "--storage", "ephemeral", "--ttl", "1s")
		require.Equal(t, 1, code)
		require.Contains(t, out, "is not held")
		code, _, _ = pgrl(url, "cleanup")
		require.Equal(t, 0, code)
	}
}

// acquire --wait: woken by a release, it acquires; with no release, it
// gives up at --timeout and exits 1, saying so.
func TestAcquireWait(t *testing.T) {
	t.Parallel()
	url := testdb.NewSchema(t).URL(t)
	policy := []string{"--prefix", "gpu", "--max", "3", "--ttl", "1m"}
	code, out, stderr := pgrl(url, append([]string{"acquire", "node", "--weight", "3"}, policy...)...)
	require.Equal(t, 0, code, stderr)
	id := strings.Fields(out)[0]

	start := time.Now()
	code, out, _ = pgrl(url, append([]string{"acquire", "node", "--wait", "--timeout", "700ms"}, policy...)...)
	took := time.Since(start)
	require.Equal(t, 1, code)
	require.GreaterOrEqual(t, took, 700*time.Millisecond)
	require.Less(t, took, 30*time.Second)
	require.Regexp(t, `^denied: waited 700ms \(--timeout\) for 1 unit of "node", none came free: 3 of 3 held \(nothing taken\); retry in (59|1m)`, out)
	code, out, _ = pgrl(url, append([]string{"acquire", "node", "--wait", "--timeout", "300ms", "--json"}, policy...)...)
	require.Equal(t, 1, code)
	require.Regexp(t, `^\{"key":"node","acquired":false,"weight":1,"held":3,"limit":3,"retry_after_ms":\d+,"waited":true\}\n$`, out)

	var wg sync.WaitGroup
	var waitCode int
	var waitOut string
	start = time.Now()
	wg.Go(func() {
		waitCode, waitOut, _ = pgrl(url, append([]string{"acquire", "node", "--weight", "2", "--wait", "--timeout", "30s"}, policy...)...)
	})
	time.Sleep(500 * time.Millisecond)
	code, _, stderr = pgrl(url, append([]string{"release", "node", id}, policy[:2]...)...)
	require.Equal(t, 0, code, stderr)
	wg.Wait()
	require.Equal(t, 0, waitCode, waitOut)
	require.Less(t, time.Since(start), 10*time.Second, "woken by the release, not by its expiry")
	require.Regexp(t, `^\S+  acquired 2 units of "node" \(token \d+\): 2 of 3 held, expires in 1m\n$`, waitOut)
}

package demo

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// jobsAnswer is the answer to a start, a kill or a reset of jobs: what it
// did (the card's state is the state's, jobsNow).
type jobsAnswer struct {
	Message string `json:"message"`
}

// postJobs posts to the jobs card's path and returns the answer.
func postJobs(t *testing.T, page, path string) (int, http.Header, jobsAnswer) {
	t.Helper()
	resp, err := http.Post(page+"api/jobs/"+path, "", nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	var a jobsAnswer
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&a))
	return resp.StatusCode, resp.Header, a
}

// jobsNow is the jobs card's state.
func jobsNow(t *testing.T, page string) jobsJSON {
	t.Helper()
	var st stateJSON
	require.Equal(t, 200, getJSON(t, "GET", page+"api/state", nil, &st))
	return st.Jobs
}

// counts are the units the jobs' leases hold: all, the running jobs', the
// killed ones'.
func counts(j jobsJSON) [3]int64 { return [3]int64{j.Held, j.Running, j.Killed} }

// jobsWhen polls the state until cond holds of its jobs, and returns them.
func jobsWhen(t *testing.T, page, what string, within time.Duration, cond func(jobsJSON) bool) jobsJSON {
	t.Helper()
	var st stateJSON
	for deadline := time.Now().Add(within); ; time.Sleep(20 * time.Millisecond) {
		require.Equal(t, 200, getJSON(t, "GET", page+"api/state", nil, &st))
		if cond(st.Jobs) {
			return st.Jobs
		}
		require.True(t, time.Now().Before(deadline), "%s: %+v", what, st.Jobs)
	}
}

// checkJobsAPI (TTL 4s, jobs of 6s): three jobs take the three slots, a
// fourth is denied (429, Retry-After, why); a job killed keeps its slot
// until its lease expires, then the slot is free, while the heartbeats keep
// the others'; a job that ends releases its slot before its lease would
// expire; starting over releases every lease at once.
func checkJobsAPI(t *testing.T, page string, db *pgxpool.Pool) {
	var st stateJSON
	require.Equal(t, 200, getJSON(t, "GET", page+"api/state", nil, &st))
	require.Equal(t, jobsJSON{Prefix: "demo-jobs", Max: 3, TTLMS: 4000, HeartbeatMS: 1333, JobMS: 6000}, st.Jobs)
	// The leases themselves, as the operator UI lists them.
	sem, err := pgratelimit.NewSemaphore(db, pgratelimit.SemaphoreConfig{Prefix: jobsPrefix, Max: jobsMax, TTL: 4 * time.Second})
	require.NoError(t, err)
	leases := func() []pgratelimit.Lease {
		ls, err := sem.Leases(context.Background(), "ip:127.0.0.1")
		require.NoError(t, err)
		return ls
	}

	started := regexp.MustCompile(`^Started a job with lease token (\d+): it runs 6s, extending its lease every 1\.334s, then releases it\. (\d) of 3 slots held\.$`)
	var tokens []string
	for i := 1; i <= 3; i++ {
		code, _, a := postJobs(t, page, "start")
		require.Equal(t, 200, code, a.Message)
		m := started.FindStringSubmatch(a.Message)
		require.NotNil(t, m, a.Message)
		require.Equal(t, strconv.Itoa(i), m[2])
		tokens = append(tokens, m[1])
		require.Equal(t, jobsJSON{Prefix: "demo-jobs", Max: 3, TTLMS: 4000, HeartbeatMS: 1333, JobMS: 6000, Held: int64(i), Running: int64(i)}, jobsNow(t, page))
		ls := leases()
		require.Len(t, ls, i)
		require.Equal(t, m[1], strconv.FormatInt(ls[i-1].Token, 10))
	}
	code, h, a := postJobs(t, page, "start")
	require.Equal(t, 429, code)
	require.Regexp(t, `^Denied: all 3 slots are held \(3 of 3\), so no job started\. The soonest lease expires in [0-4](\.\d+)?s; a job that ends releases its slot sooner\.$`, a.Message)
	require.Contains(t, []string{"1", "2", "3", "4"}, h.Get("Retry-After"))
	require.Equal(t, [3]int64{3, 3, 0}, counts(jobsNow(t, page)))

	// Kill the oldest: its slot stays held until its lease expires.
	beforeKill := time.Now()
	code, _, a = postJobs(t, page, "kill")
	require.Equal(t, 200, code)
	require.Regexp(t, `^Killed the job with lease token `+tokens[0]+` without releasing its lease: no more heartbeats, so its slot comes back when the lease expires, in [0-4](\.\d+)?s\.$`, a.Message)
	require.Equal(t, [3]int64{3, 2, 1}, counts(jobsNow(t, page)))
	killed := leases()[0]
	require.Equal(t, tokens[0], strconv.FormatInt(killed.Token, 10))
	expires := time.Until(killed.ExpiresAt) // (both clocks are this machine's)
	j := jobsWhen(t, page, "the killed job's slot back", 10*time.Second, func(j jobsJSON) bool { return j.Held == 2 })
	require.GreaterOrEqual(t, time.Since(beforeKill), expires-10*time.Millisecond, "back at its lease's expiry, not before")
	require.Equal(t, [3]int64{2, 2, 0}, counts(j), "the heartbeats kept the others'")
	ls := leases()
	require.Equal(t, tokens[1:], []string{strconv.FormatInt(ls[0].Token, 10), strconv.FormatInt(ls[1].Token, 10)})

	// A slot again; the job that ends releases it, before its lease expires.
	code, _, a = postJobs(t, page, "start")
	require.Equal(t, 200, code, a.Message)
	ends := time.Now().Add(6 * time.Second) // (it runs 6s)
	ls = leases()
	last := ls[len(ls)-1]
	jobsWhen(t, page, "every job ended", 15*time.Second, func(j jobsJSON) bool { return j.Held == 0 })
	require.Less(t, time.Until(ends), time.Second, "not before it ends")
	// Released when it ended, not left to expire (2.7s or more after its
	// last heartbeat): releasing it again is nothing, where a lease that
	// expired less than a TTL ago is ErrLeaseExpired.
	require.NoError(t, sem.Release(context.Background(), "ip:127.0.0.1", last.ID), "released when it ended, not left to expire")

	// Nothing to kill; starting over releases at once.
	code, _, a = postJobs(t, page, "kill")
	require.Equal(t, 200, code)
	require.Equal(t, "No running job to kill: start one first.", a.Message)
	for range 2 {
		code, _, _ = postJobs(t, page, "start")
		require.Equal(t, 200, code)
	}
	code, _, a = postJobs(t, page, "reset")
	require.Equal(t, 200, code)
	require.Equal(t, "Started over: every job stopped and every lease released, 3 slots free.", a.Message)
	require.Zero(t, jobsNow(t, page).Held)
	require.Empty(t, leases())
}

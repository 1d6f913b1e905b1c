package bench

import (
	"fmt"
	"io"
	"time"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/human"
)

// Report is a run's result: the line `pgratelimit bench --json` prints, and
// what the peer harness reads of it.
type Report struct {
	Contender    string  `json:"contender"`
	Conc         int     `json:"conc"`
	Keys         int     `json:"keys"`
	Secs         float64 `json:"secs"`
	ChecksPerSec float64 `json:"checks_per_sec"`
	P50ms        float64 `json:"p50_ms"`
	P99ms        float64 `json:"p99_ms"`
	MaxMs        float64 `json:"max_ms"`
	Allowed      int64   `json:"allowed"`
	Denied       int64   `json:"denied"`
	Errors       int64   `json:"errors"`
	Audit        string  `json:"audit"`
	HotRatio     float64 `json:"hot_update_ratio"`
	Updates      int64   `json:"updates"`
	Limits       int     `json:"limits"`
	Commit       string  `json:"commit"` // sync, or async (Config.AsyncCommit)
	Distributed  bool    `json:"distributed"`
	// Alerts says the run's limiters had usage alerts (--alerts), and
	// Events counts the events they wrote.
	Alerts bool  `json:"alerts"`
	Events int64 `json:"events"`
	// With --prefill: the rows put in the table before the run, and the
	// table's and its indexes' size after.
	PrefillRows int64 `json:"prefill_rows,omitempty"`
	TableBytes  int64 `json:"table_bytes,omitempty"`
	IndexBytes  int64 `json:"index_bytes,omitempty"`
	// CPU time per check: this process's, and the database server's
	// processes' when the server runs on this machine (0 otherwise; on
	// Citus, the coordinator's alone).
	ClientUsPerCheck float64 `json:"client_us_per_check"`
	ServerUsPerCheck float64 `json:"server_us_per_check"`
	// With --leases (Leases) a check is an acquisition of a lease of
	// LeaseMax units per key: Allowed counts those acquired, each released
	// at once, Denied those that found no free units, and ChecksPerSec and
	// the CPU per check are per acquisition. Pairs are the acquire+release
	// pairs (Allowed), PairsPerSec their rate, the CPU per pair the run's
	// over them (denied acquisitions included); P50ms, P99ms and MaxMs are
	// the pairs' latency, from the acquisition sent to the release done.
	Leases          bool    `json:"leases"`
	LeaseMax        int64   `json:"lease_max,omitempty"`
	Pairs           int64   `json:"pairs,omitempty"`
	PairsPerSec     float64 `json:"pairs_per_sec,omitempty"`
	ClientUsPerPair float64 `json:"client_us_per_pair,omitempty"`
	ServerUsPerPair float64 `json:"server_us_per_pair,omitempty"`
}

// OK says whether the run's exactness audit passed.
func (r Report) OK() bool { return r.Audit == "ok" }

// WriteText writes the report for people: throughput, latency, outcomes,
// CPU per check, the events written with --alerts, the audit, HOT updates
// and, after a prefill, the table's size. duration and cost are the run's, as asked.
func (r Report) WriteText(w io.Writer, duration time.Duration, cost int64) {
	if r.Leases {
		r.writeLeases(w, duration, cost)
	} else {
		fmt.Fprintf(w, "%s: %d in flight, %d keys, %s, cost %d\n", r.Contender, r.Conc, r.Keys, duration, cost)
		fmt.Fprintf(w, "  %.0f checks/s   p50 %.2f ms   p99 %.2f ms   max %.2f ms\n", r.ChecksPerSec, r.P50ms, r.P99ms, r.MaxMs)
		fmt.Fprintf(w, "  allowed %d   denied %d   errors %d\n", r.Allowed, r.Denied, r.Errors)
		fmt.Fprintf(w, "  CPU per check: client %.1f µs, server %s µs\n", r.ClientUsPerCheck, serverText(r.ServerUsPerCheck))
	}
	if r.Alerts {
		fmt.Fprintf(w, "  alerts: %s written\n", human.Plural(r.Events, "event", "events"))
	}
	fmt.Fprintf(w, "  audit: %s\n", r.Audit)
	fmt.Fprintf(w, "  HOT updates: %.1f%% of %d\n", 100*r.HotRatio, r.Updates)
	if r.PrefillRows > 0 {
		fmt.Fprintf(w, "  prefilled %d rows: table %d MB, indexes %d MB\n", r.PrefillRows, r.TableBytes>>20, r.IndexBytes>>20)
	}
}

// writeLeases writes the head of a report of a run with --leases: pairs
// per second and their latency, the acquisitions, the CPU per pair.
func (r Report) writeLeases(w io.Writer, duration time.Duration, weight int64) {
	fmt.Fprintf(w, "%s: %d in flight, %d keys, %s, leases of %s of %d per key, each released at once\n",
		r.Contender, r.Conc, r.Keys, duration, human.Plural(weight, "unit", "units"), r.LeaseMax)
	fmt.Fprintf(w, "  %.0f pairs/s (acquire + release)   p50 %.2f ms   p99 %.2f ms   max %.2f ms (a pair)\n", r.PairsPerSec, r.P50ms, r.P99ms, r.MaxMs)
	fmt.Fprintf(w, "  acquisitions: %.0f/s, %d acquired and released, %d denied (no free units), %d errors\n", r.ChecksPerSec, r.Allowed, r.Denied, r.Errors)
	fmt.Fprintf(w, "  CPU per pair: client %.1f µs, server %s µs\n", r.ClientUsPerPair, serverText(r.ServerUsPerPair))
}

// serverText is a server CPU time per check or pair, in µs: n/a when it
// could not be read.
func serverText(us float64) string {
	if us > 0 {
		return fmt.Sprintf("%.1f", us)
	}
	return "n/a (not a local server)"
}

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// report is everything the harness measured, as the JSON result file has it.
type report struct {
	Started     string            `json:"started"`
	Finished    string            `json:"finished"`
	Interrupted bool              `json:"interrupted,omitempty"`
	Runs        int               `json:"runs"`
	LatencyMS   int               `json:"latency_ms"`
	Machine     map[string]any    `json:"machine"`
	Contenders  map[string]string `json:"contenders"`
	Scenarios   []scenarioReport  `json:"scenarios"`
}

type scenarioReport struct {
	Scenario scenario          `json:"scenario"`
	Results  []contenderReport `json:"results"`
}

type contenderReport struct {
	Contender string   `json:"contender"`
	Label     string   `json:"label"`
	Median    *result  `json:"median,omitempty"` // of the runs without an error, field by field
	Runs      []result `json:"runs"`
}

// newReport starts the report of a run with o's settings.
func newReport(o Options) *report {
	return &report{
		Started:    time.Now().UTC().Format(time.RFC3339),
		Runs:       o.Runs,
		LatencyMS:  int(o.Latency / time.Millisecond),
		Contenders: map[string]string{},
	}
}

// failed says whether a contender failed in every run of a scenario.
func (r *report) failed() bool {
	for _, s := range r.Scenarios {
		for _, c := range s.Results {
			if c.Median == nil {
				return true
			}
		}
	}
	return false
}

// median takes each figure's median over the runs that finished without an error.
func median(runs []result) *result {
	var ok []result
	for _, r := range runs {
		if r.Error == "" {
			ok = append(ok, r)
		}
	}
	if len(ok) == 0 {
		return nil
	}
	if len(ok) == 1 {
		m := ok[0]
		m.Run = 0
		return &m
	}
	med := func(get func(result) float64) float64 {
		v := make([]float64, len(ok))
		for i, r := range ok {
			v[i] = get(r)
		}
		slices.Sort(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	m := result{
		Checks:           int64(med(func(r result) float64 { return float64(r.Checks) })),
		Denied:           int64(med(func(r result) float64 { return float64(r.Denied) })),
		Errors:           int64(med(func(r result) float64 { return float64(r.Errors) })),
		ElapsedS:         round(med(func(r result) float64 { return r.ElapsedS }), 2),
		ChecksPerSec:     round(med(func(r result) float64 { return r.ChecksPerSec }), 0),
		P50ms:            round(med(func(r result) float64 { return r.P50ms }), 3),
		P99ms:            round(med(func(r result) float64 { return r.P99ms }), 3),
		ServerCPUs:       round(med(func(r result) float64 { return r.ServerCPUs }), 2),
		ClientCPUs:       round(med(func(r result) float64 { return r.ClientCPUs }), 2),
		ServerUsPerCheck: round(med(func(r result) float64 { return r.ServerUsPerCheck }), 1),
		ClientUsPerCheck: round(med(func(r result) float64 { return r.ClientUsPerCheck }), 1),
		OtherLoad:        round(med(func(r result) float64 { return r.OtherLoad }), 3),
		WallS:            round(med(func(r result) float64 { return r.WallS }), 2),
	}
	return &m
}

func ms(x float64) string {
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0f", x)
	case x >= 10:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.2f", x)
	}
}

// head writes the title and the head of the scenario's table, and returns
// the cells of a row without figures. Leases have a column more: the
// acquisitions denied, per second.
func (s scenarioReport) head(b *strings.Builder) (blank string) {
	fmt.Fprintf(b, "### %s\n\n", s.Scenario)
	unit, denied, sep, blank := s.Scenario.unit(), "", "", "| | | | |"
	if s.Scenario.Workload == leases {
		denied, sep, blank = " denied/s |", "---:|", "| | | | | |"
	}
	fmt.Fprintf(b, "| contender | %ss/s | p50 ms | p99 ms | server µs/%s | client µs/%s |%s\n", unit, unit, unit, denied)
	b.WriteString("|---|---:|---:|---:|---:|---:|" + sep + "\n")
	return blank
}

func (s scenarioReport) markdown(runs, latencyMS int) string {
	var b strings.Builder
	unit, blank := s.Scenario.unit(), s.head(&b)
	var notes []string
	lo, hi := 1.0, 0.0
	for _, c := range s.Results {
		m := c.Median
		if len(c.Runs) == 0 || (m == nil && c.Runs[0].Error == "interrupted") {
			fmt.Fprintf(&b, "| %s | not run %s\n", c.Label, blank)
			continue
		}
		if m == nil {
			fmt.Fprintf(&b, "| %s | failed %s\n", c.Label, blank)
			for _, r := range c.Runs {
				if r.Error != "" && r.Error != "interrupted" {
					notes = append(notes, fmt.Sprintf("%s, run %d: %s", c.Contender, r.Run, oneLine(r.Error)))
					break
				}
			}
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %.1f | %.1f |", c.Label, thousands(m.ChecksPerSec),
			ms(m.P50ms), ms(m.P99ms), m.ServerUsPerCheck, m.ClientUsPerCheck)
		if s.Scenario.Workload == leases {
			fmt.Fprintf(&b, " %s |", thousands(deniedPerSec(m)))
		}
		b.WriteString("\n")
		failed, errs := 0, int64(0)
		for _, r := range c.Runs {
			if r.Error != "" {
				failed++
			}
			errs += r.Errors
			lo, hi = min(lo, r.OtherLoad), max(hi, r.OtherLoad)
		}
		if failed > 0 {
			notes = append(notes, fmt.Sprintf("%s: %d of %d runs failed and are left out", c.Contender, failed, len(c.Runs)))
		}
		if errs > 0 {
			notes = append(notes, fmt.Sprintf("%s: %d %ss returned an error (not counted as %ss)", c.Contender, errs, unit, unit))
		}
		if a, ok := m.Extra["audit"].(string); ok && a != "ok" {
			notes = append(notes, fmt.Sprintf("%s: audit %s", c.Contender, a))
		}
	}
	b.WriteString("\n")
	what := "One run"
	if runs > 1 {
		what = fmt.Sprintf("Median of %d interleaved runs", runs)
	}
	if latencyMS > 0 {
		what += fmt.Sprintf(", every response from PostgreSQL and Redis delayed %d ms", latencyMS)
	}
	if hi >= lo {
		load := fmt.Sprintf("%.0f-%.0f%%", 100*lo, 100*hi)
		if fmt.Sprintf("%.0f", 100*lo) == fmt.Sprintf("%.0f", 100*hi) {
			load = fmt.Sprintf("%.0f%%", 100*hi)
		}
		what += ". Other load on the machine during the runs (neither server nor client"
		if latencyMS > 0 {
			what += ", the delay proxies included"
		}
		what += "): " + load + " of its CPU"
	}
	b.WriteString(what + ".\n")
	for _, n := range notes {
		b.WriteString("- " + n + "\n")
	}
	return b.String()
}

// deniedPerSec is the rate of the acquisitions of m that found no free
// units.
func deniedPerSec(m *result) float64 {
	if m.ElapsedS <= 0 {
		return 0
	}
	return float64(m.Denied) / m.ElapsedS
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// write stores the report as JSON and the tables as markdown, and returns their paths.
func (r *report) write(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	t, err := time.Parse(time.RFC3339, r.Started)
	if err != nil {
		t = time.Now().UTC()
	}
	base := filepath.Join(dir, "peers-"+t.Format("20060102T150405Z"))
	j, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(base+".json", append(j, '\n'), 0o644); err != nil {
		return nil, err
	}
	var md strings.Builder
	fmt.Fprintf(&md, "# Peer benchmark, %s\n\n", r.Started)
	fmt.Fprintf(&md, "Machine: %v CPUs (%v), %v GiB; %v; PostgreSQL %v, Redis %v, Node %v, %v; commit %v.\n",
		r.Machine["cpus"], r.Machine["cpu"], r.Machine["memory_gib"], r.Machine["os"],
		shortVersion(fmt.Sprint(r.Machine["postgresql"])), shortVersion(fmt.Sprint(r.Machine["redis"])),
		r.Machine["node"], r.Machine["go"], r.Machine["commit"])
	if r.Interrupted {
		md.WriteString("\nInterrupted: the last scenario is incomplete.\n")
	}
	for _, s := range r.Scenarios {
		md.WriteString("\n" + s.markdown(r.Runs, r.LatencyMS))
	}
	if err := os.WriteFile(base+".md", []byte(md.String()), 0o644); err != nil {
		return nil, err
	}
	return []string{base + ".md", base + ".json"}, nil
}

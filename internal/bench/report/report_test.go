package report

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/perf"
)

// result is a latency table of one row.
func result(test string) perf.Result {
	return perf.Result{Title: "T " + test, Test: test, Mode: perf.ModeLat,
		Latency: []perf.LatencyStats{perf.Latency(8, []time.Duration{time.Microsecond, 2 * time.Microsecond})}}
}

// TestTextAndChecks: a table prints when it is added; Finish prints the
// derived checks and the figures added beside them, and with check set a
// missed target is ErrTargetMissed naming it.
func TestTextAndChecks(t *testing.T) {
	var w strings.Builder
	derive := func(rep *perf.Report) []perf.Check {
		return []perf.Check{perf.Figure("tables", float64(len(rep.Results)), "").AtMost(1)}
	}
	o := New(&w, false, derive)
	if err := o.Add(result("read")); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(w.String(), "T read") {
		t.Fatalf("table not printed on Add: %q", w.String())
	}
	o.AddFigures(perf.Figure("outside the tables", 3, " M/s"))
	if err := o.Finish(true); err != nil {
		t.Fatalf("Finish with every target met: %v", err)
	}
	if !strings.Contains(w.String(), "outside the tables") || !strings.Contains(w.String(), "tables") {
		t.Errorf("checks not printed: %q", w.String())
	}
	o = New(&strings.Builder{}, false, derive)
	o.Add(result("read"))
	o.Add(result("write"))
	if err := o.Finish(false); err != nil {
		t.Errorf("Finish without -check: %v", err)
	}
	if err := o.Finish(true); !errors.Is(err, ErrTargetMissed) || !strings.Contains(err.Error(), "tables") {
		t.Errorf("Finish with a missed target: %v, want ErrTargetMissed naming it", err)
	}
}

// TestJSON: with json set nothing prints until Finish, which writes one
// document holding the tables and the checks.
func TestJSON(t *testing.T) {
	var w strings.Builder
	o := New(&w, true, func(*perf.Report) []perf.Check { return []perf.Check{perf.Figure("f", 1, "")} })
	o.Add(result("read"))
	if w.Len() != 0 {
		t.Fatalf("JSON output printed before Finish: %q", w.String())
	}
	if err := o.Finish(false); err != nil {
		t.Fatal(err)
	}
	var rep perf.Report
	if err := json.Unmarshal([]byte(w.String()), &rep); err != nil {
		t.Fatalf("not one JSON document: %v", err)
	}
	if rep.Tool != "krbench" || len(rep.Results) != 1 || len(rep.Checks) != 1 {
		t.Errorf("report %+v", rep)
	}
}

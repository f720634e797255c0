// Package report is krbench's output: the tables of a run, printed as
// each finishes (or kept for one JSON document), and at the end the checks
// derived from them, with ErrTargetMissed when -check is set and a target
// was missed.
package report

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/krcore/krcore/internal/perf"
)

// Output collects a run's tables: printed as each finishes (so a long -a
// run shows progress), or kept for one JSON document at the end.
type Output struct {
	json   bool
	w      io.Writer
	rep    perf.Report
	derive func(*perf.Report) []perf.Check
	extra  []perf.Check // figures measured outside the tables (krbench daemon's connects/s)
}

// New is the output of a run to w, as JSON if json is set; derive makes
// the checks from the run's tables when it finishes.
func New(w io.Writer, json bool, derive func(*perf.Report) []perf.Check) *Output {
	host, _ := os.Hostname()
	return &Output{json: json, w: w, derive: derive, rep: perf.Report{
		Tool: "krbench",
		Info: []perf.Field{
			{Key: "host", Value: host},
			{Key: "go", Value: runtime.Version()},
			{Key: "gomaxprocs", Value: strconv.Itoa(runtime.GOMAXPROCS(0))},
			{Key: "started", Value: time.Now().UTC().Format(time.RFC3339)},
		},
	}}
}

// Add records a table, printing it unless the output is JSON.
func (o *Output) Add(r perf.Result) error {
	o.rep.Results = append(o.rep.Results, r)
	if o.json {
		return nil
	}
	return r.WriteText(o.w)
}

// AddFigures records figures measured outside the tables, reported with
// the checks.
func (o *Output) AddFigures(figures ...perf.Check) { o.extra = append(o.extra, figures...) }

// Finish derives the checks and prints them (or the whole JSON report). It
// returns ErrTargetMissed if check is set and a target was missed.
func (o *Output) Finish(check bool) error {
	o.rep.Checks = append(o.derive(&o.rep), o.extra...)
	var err error
	if o.json {
		err = o.rep.WriteJSON(o.w)
	} else {
		err = (&perf.Report{Checks: o.rep.Checks}).WriteText(o.w)
	}
	if err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if check {
		for _, c := range o.rep.Checks {
			if c.Met != nil && !*c.Met {
				return fmt.Errorf("%w: %s = %.2f%s, target %s", ErrTargetMissed, c.Name, c.Value, c.Unit, c.Target)
			}
		}
	}
	return nil
}

// ErrTargetMissed marks a -check run that missed a target (exit status 3).
var ErrTargetMissed = errors.New("a target was missed")

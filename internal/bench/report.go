package bench

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/krcore/krcore/internal/perf"
)

// output collects a run's tables: printed as each finishes (so a long -a
// run shows progress), or kept for one JSON document at the end.
type output struct {
	json  bool
	w     io.Writer
	rep   perf.Report
	extra []perf.Check // figures measured outside the tables (krbench daemon's connects/s)
}

func newOutput(cfg *config, w io.Writer) *output {
	host, _ := os.Hostname()
	return &output{json: cfg.json, w: w, rep: perf.Report{
		Tool: "krbench",
		Info: []perf.Field{
			{Key: "host", Value: host},
			{Key: "go", Value: runtime.Version()},
			{Key: "gomaxprocs", Value: strconv.Itoa(runtime.GOMAXPROCS(0))},
			{Key: "started", Value: time.Now().UTC().Format(time.RFC3339)},
		},
	}}
}

func (o *output) add(r perf.Result) error {
	o.rep.Results = append(o.rep.Results, r)
	if o.json {
		return nil
	}
	return r.WriteText(o.w)
}

// finish derives the checks and prints them (or the whole JSON report). It
// returns errTargetMissed if check is set and a target was missed.
func (o *output) finish(check bool) error {
	o.rep.Checks = append(append(deriveChecks(&o.rep), deriveDaemonChecks(&o.rep)...), o.extra...)
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
				return fmt.Errorf("%w: %s = %.2f%s, target %s", errTargetMissed, c.Name, c.Value, c.Unit, c.Target)
			}
		}
	}
	return nil
}

package main

import (
	"fmt"
	"time"

	"github.com/krcore/krcore/internal/plot"
)

// writePlot draws every mode's throughput over time (mean over rounds,
// all clients, ops/s per bucket; t = 0 is the spike) as a PNG.
func writePlot(path string, cfg spikeConfig, runs map[string][]modeRun) error {
	c := plot.Chart{
		Title: fmt.Sprintf("YCSB %s ops/s, all clients (%d, then +%d at t = 0)",
			cfg.Workload, cfg.Base, cfg.Spike),
		XLabel: "t (s) from the spike",
		YLabel: "ops/s",
	}
	for _, m := range cfg.Modes {
		var sums []float64
		for _, r := range runs[m] {
			for len(sums) < len(r.Ops) {
				sums = append(sums, 0)
			}
			for i, v := range r.Ops {
				sums[i] += float64(v) / cfg.Bucket.Seconds() / float64(len(runs[m]))
			}
		}
		s := plot.Series{Name: m}
		for i, v := range sums {
			t := time.Duration(i)*cfg.Bucket + cfg.Bucket/2 - cfg.Warm
			s.Points = append(s.Points, plot.Point{X: t.Seconds(), Y: v})
		}
		c.Series = append(c.Series, s)
	}
	return c.WriteFile(path)
}

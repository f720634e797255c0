package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/anishathalye/porcupine"
)

// config is the command line.
type config struct {
	spike    spikeConfig
	lin      linConfig
	memNodes int
	dir      string
	fabric   fabric // every process's RNIC and RC attributes
}

// check says what is wrong with the command line.
func (c config) check() error {
	for _, m := range c.spike.Modes {
		if !slices.Contains([]string{modeRaw, modeEmbedded, modeDaemon}, m) {
			return fmt.Errorf("-modes: %q is not raw, embedded or daemon", m)
		}
	}
	s := c.spike
	if _, ok := workloads[s.Workload]; !ok {
		return fmt.Errorf("-workload %q: A, B or C", s.Workload)
	}
	if s.Base < 1 || s.Spike < 1 || s.Keys < 1 || s.Value < 1 || s.Warm <= 0 || s.After <= 0 || s.Bucket <= 0 || s.Rounds < 1 || c.memNodes < 1 {
		return errors.New("-base, -spike, -keys, -value, -rounds, -memnodes >= 1 and -warm, -after, -bucket > 0")
	}
	if err := c.fabric.check(); err != nil {
		return err
	}
	if c.lin.Clients > 0 && (c.lin.Ops < 1 || c.lin.Keys < 1) {
		return errors.New("-lin-ops and -lin-keys >= 1")
	}
	return nil
}

// heapPerKey is the heap a memory node gets per key loaded: room for the
// loaded blocks and the ones updates write (never reclaimed).
const heapPerKey = 4 << 10

// run starts the site, runs the spike scenario, then the linearizability
// check in every mode.
func run(ctx context.Context, cfg config, out io.Writer) (err error) {
	s, err := startSite(ctx, cfg.fabric, cfg.memNodes, cfg.spike.Keys, cfg.spike.Value, max(cfg.spike.Keys*heapPerKey/cfg.memNodes, 64<<20))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, s.close()) }()
	if _, err := runSpike(ctx, s, cfg.spike, cfg.dir, out); err != nil {
		return err
	}
	if cfg.lin.Clients == 0 {
		return nil
	}
	fmt.Fprintln(out)
	for _, m := range cfg.spike.Modes {
		lc := cfg.lin
		lc.Mode = m
		rep, err := runLin(ctx, s, lc, cfg.dir, out)
		if err != nil {
			return err
		}
		if rep.Result != porcupine.Ok {
			return fmt.Errorf("%s: the history is not linearizable (%s)", m, rep.Result)
		}
	}
	return nil
}

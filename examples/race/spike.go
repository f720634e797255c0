package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/krcore/krcore/internal/liteapp"
	"github.com/krcore/krcore/internal/perf"
)

// spikeConfig is the load-spike scenario: Base clients run Workload, then
// Spike new client processes start at once, Warm after the first; all
// run until After past the spike.
type spikeConfig struct {
	Modes       []string
	Base, Spike int
	Workload    string
	Keys, Value int
	Warm, After time.Duration
	Bucket      time.Duration
	Rounds      int
}

// bootTimes is one client's bootstrap, split into its steps.
type bootTimes struct {
	Client                             uint64
	Exec, Setup, Connect, First, Total time.Duration
}

// bootOf splits b, for a process spawned at spawned.
func bootOf(id uint64, spawned time.Time, b boot) bootTimes {
	t := func(ns int64) time.Time { return time.Unix(0, ns) }
	return bootTimes{Client: id,
		Exec:    t(b.Main).Sub(spawned),
		Setup:   time.Duration(b.Ready - b.Main),
		Connect: time.Duration(b.Connected - b.Ready),
		First:   time.Duration(b.First - b.Connected),
		Total:   t(b.First).Sub(spawned),
	}
}

// modeRun is one run of the scenario in one mode.
type modeRun struct {
	Mode   string
	Round  int
	Boots  []bootTimes // the spike's clients
	Ops    []int       // completed operations per bucket, all clients
	Before []time.Duration
	After  []time.Duration
	// SpikeBucket is the bucket the spike started in.
	SpikeBucket int
}

// spikeOnce runs the scenario once in mode against s.
func spikeOnce(ctx context.Context, s *site, cfg spikeConfig, mode string, round int) (modeRun, error) {
	run := modeRun{Mode: mode, Round: round, SpikeBucket: int(cfg.Warm / cfg.Bucket)}
	epoch := time.Now()
	spikeAt, until := epoch.Add(cfg.Warm), epoch.Add(cfg.Warm+cfg.After)
	start := func(n int) ([]*proc, error) {
		var ps []*proc
		for range n {
			job := s.job(mode, cfg.Keys)
			job.Workload, job.Value = cfg.Workload, cfg.Value
			job.Epoch, job.Bucket, job.Spike, job.Until = epoch.UnixNano(), int64(cfg.Bucket), spikeAt.UnixNano(), until.UnixNano()
			p, err := spawn(ctx, job, 0)
			if err != nil {
				return ps, err
			}
			ps = append(ps, p)
		}
		return ps, nil
	}
	base, err := start(cfg.Base)
	all := base
	defer func() {
		for _, p := range all { // after an error: do not leave them running
			p.cmd.Process.Kill()
			p.wait(ctx)
		}
	}()
	if err != nil {
		return run, err
	}
	for _, p := range base {
		if _, err := p.waitBoot(ctx); err != nil {
			return run, err
		}
	}
	if time.Now().After(spikeAt) {
		return run, fmt.Errorf("the %d base clients took longer than -warm %v to start: make it longer", cfg.Base, cfg.Warm)
	}
	select { // the scenario's clock: the spike comes at its time
	case <-time.After(time.Until(spikeAt)):
	case <-ctx.Done():
		return run, ctx.Err()
	}
	spike, err := start(cfg.Spike)
	all = append(all, spike...)
	if err != nil {
		return run, err
	}
	for _, p := range spike {
		b, err := p.waitBoot(ctx)
		if err != nil {
			return run, err
		}
		run.Boots = append(run.Boots, bootOf(p.job.ID, p.spawned, b))
	}
	for _, p := range all {
		lines, err := p.wait(ctx)
		if err != nil {
			return run, err
		}
		var res result
		if rs := linesOf(lines, "result"); len(rs) != 1 || json.Unmarshal([]byte(rs[0]), &res) != nil {
			return run, fmt.Errorf("client %d reported no result", p.job.ID)
		}
		run.Ops = addInts(run.Ops, res.Ops)
		run.Before = appendNS(run.Before, res.Before)
		run.After = appendNS(run.After, res.After)
	}
	all = nil
	return run, nil
}

// addInts adds b into a, element by element, growing a as needed.
func addInts(a, b []int) []int {
	for len(a) < len(b) {
		a = append(a, 0)
	}
	for i, v := range b {
		a[i] += v
	}
	return a
}

// appendNS appends nanosecond counts as durations.
func appendNS(d []time.Duration, ns []int64) []time.Duration {
	for _, v := range ns {
		d = append(d, time.Duration(v))
	}
	return d
}

// summary is a mode's figures over its rounds.
type summary struct {
	Mode                   string
	Total, InProcess, Exec perf.LatencyStats // bootstrap: spawn to first lookup, main to first lookup, spawn to main
	Setup, Connect, First  perf.LatencyStats
	Before, After          perf.LatencyStats // lookup latency
	TputBefore, TputAfter  float64           // ops/s, whole windows
	Spawned                int
}

// summarize pools a mode's rounds.
func summarize(cfg spikeConfig, runs []modeRun) summary {
	sm := summary{Mode: runs[0].Mode}
	var total, inproc, exec, setup, conn, first, before, after []time.Duration
	var opsBefore, opsAfter int
	for _, r := range runs {
		for _, b := range r.Boots {
			total, inproc, exec = append(total, b.Total), append(inproc, b.Total-b.Exec), append(exec, b.Exec)
			setup, conn, first = append(setup, b.Setup), append(conn, b.Connect), append(first, b.First)
		}
		before, after = append(before, r.Before...), append(after, r.After...)
		for i, n := range r.Ops {
			if i < r.SpikeBucket {
				opsBefore += n
			} else {
				opsAfter += n
			}
		}
	}
	sm.Spawned = len(total)
	sm.Total, sm.InProcess, sm.Exec = perf.Latency(0, total), perf.Latency(0, inproc), perf.Latency(0, exec)
	sm.Setup, sm.Connect, sm.First = perf.Latency(0, setup), perf.Latency(0, conn), perf.Latency(0, first)
	sm.Before, sm.After = perf.Latency(0, before), perf.Latency(0, after)
	sm.TputBefore = float64(opsBefore) / (cfg.Warm.Seconds() * float64(len(runs)))
	sm.TputAfter = float64(opsAfter) / (cfg.After.Seconds() * float64(len(runs)))
	return sm
}

// runSpike runs the scenario cfg.Rounds times per mode (alternating the
// modes' order), writes the CSVs and the plot into dir and prints the
// figures; it returns each mode's summary.
func runSpike(ctx context.Context, s *site, cfg spikeConfig, dir string, out io.Writer) (map[string]summary, error) {
	fmt.Fprintf(out, "race: YCSB %s, %d keys, %d B values, zipfian %.2f; %d clients, then %d more at once after %v, until %v later; %d round(s)\n",
		cfg.Workload, cfg.Keys, cfg.Value, zipfTheta, cfg.Base, cfg.Spike, cfg.Warm, cfg.After, cfg.Rounds)
	runs, err := liteapp.Alternate(cfg.Modes, cfg.Rounds, func(mode string, round int) (modeRun, error) {
		return spikeOnce(ctx, s, cfg, mode, round)
	})
	if err != nil {
		return nil, err
	}
	sums := map[string]summary{}
	for _, mode := range cfg.Modes {
		sums[mode] = summarize(cfg, runs[mode])
	}
	printSummary(out, cfg, sums)
	printRounds(out, cfg, runs)
	if dir == "" {
		return sums, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return sums, err
	}
	files := []string{filepath.Join(dir, "race-throughput.csv"), filepath.Join(dir, "race-bootstrap.csv"), filepath.Join(dir, "race-throughput.png")}
	err = errors.Join(
		writeCSV(files[0], throughputRows(cfg, runs)),
		writeCSV(files[1], bootRows(cfg, runs)),
		writePlot(files[2], cfg, runs),
	)
	if err == nil {
		fmt.Fprintf(out, "wrote %s, %s, %s\n", files[0], files[1], files[2])
	}
	return sums, err
}

// us formats microseconds.
func us(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }

// printSummary prints the bootstrap, latency and throughput table and the
// bootstrap ratios against raw RC.
func printSummary(out io.Writer, cfg spikeConfig, sums map[string]summary) {
	fmt.Fprintf(out, "\nnew client bootstrap (process spawn -> first lookup done), %s clients per mode, usec:\n", strconv.Itoa(sums[cfg.Modes[0]].Spawned))
	fmt.Fprintf(out, "  %-9s %9s %9s %9s | %9s %9s %9s %9s\n", "mode", "p50", "p99", "in-proc", "exec", "setup", "connect", "1st get")
	for _, m := range cfg.Modes {
		s := sums[m]
		fmt.Fprintf(out, "  %-9s %9s %9s %9s | %9s %9s %9s %9s\n", m, us(s.Total.Typical), us(s.Total.P99), us(s.InProcess.Typical),
			us(s.Exec.Typical), us(s.Setup.Typical), us(s.Connect.Typical), us(s.First.Typical))
	}
	fmt.Fprintf(out, "  (p50 of each step; in-proc = main() -> first lookup; setup = RNIC+runtime or attach; connect = QPs/VQs + table header)\n")
	if raw, ok := sums[modeRaw]; ok {
		for _, m := range []string{modeEmbedded, modeDaemon} {
			if s, ok := sums[m]; ok {
				fmt.Fprintf(out, "  %s / raw RC bootstrap p50: %.2fx (target <= 0.2x); in-process part: %.2fx\n", m,
					s.Total.Typical/raw.Total.Typical, s.InProcess.Typical/raw.InProcess.Typical)
			}
		}
	}
	fmt.Fprintf(out, "\nlookup latency (usec) and throughput (ops/s, all clients):\n")
	fmt.Fprintf(out, "  %-9s %9s %9s %9s %9s | %10s %10s\n", "mode", "p50 pre", "p99 pre", "p50 post", "p99 post", "ops/s pre", "ops/s post")
	for _, m := range cfg.Modes {
		s := sums[m]
		fmt.Fprintf(out, "  %-9s %9s %9s %9s %9s | %10.0f %10.0f\n", m, us(s.Before.Typical), us(s.Before.P99), us(s.After.Typical), us(s.After.P99), s.TputBefore, s.TputAfter)
	}
}

// printRounds prints each round's bootstrap p50 per mode and its ratio to
// raw RC's in the same round: the spread the pooled figures hide.
func printRounds(out io.Writer, cfg spikeConfig, runs map[string][]modeRun) {
	if cfg.Rounds < 2 {
		return
	}
	p50 := func(r modeRun) float64 {
		var total []time.Duration
		for _, b := range r.Boots {
			total = append(total, b.Total)
		}
		return perf.Latency(0, total).Typical
	}
	fmt.Fprintf(out, "\nbootstrap p50 per round, usec (ratio to raw RC's in the same round):\n")
	for round := range cfg.Rounds {
		fmt.Fprintf(out, "  round %d:", round+1)
		for _, m := range cfg.Modes {
			v := p50(runs[m][round])
			fmt.Fprintf(out, "  %s %s", m, us(v))
			if raw, ok := runs[modeRaw]; ok && m != modeRaw {
				fmt.Fprintf(out, " (%.2fx)", v/p50(raw[round]))
			}
		}
		fmt.Fprintln(out)
	}
}

// throughputRows is the throughput CSV: one row per bucket and round,
// a column per mode.
func throughputRows(cfg spikeConfig, runs map[string][]modeRun) [][]string {
	rows := [][]string{append([]string{"round", "t_from_spike_s"}, prefixed("ops_per_s_", cfg.Modes)...)}
	for round := range cfg.Rounds {
		n := 0
		for _, m := range cfg.Modes {
			n = max(n, len(runs[m][round].Ops))
		}
		for b := range n {
			row := []string{strconv.Itoa(round + 1), strconv.FormatFloat((time.Duration(b)*cfg.Bucket - cfg.Warm).Seconds(), 'f', 3, 64)}
			for _, m := range cfg.Modes {
				r, v := runs[m][round], 0
				if b < len(r.Ops) {
					v = r.Ops[b]
				}
				row = append(row, strconv.FormatFloat(float64(v)/cfg.Bucket.Seconds(), 'f', 0, 64))
			}
			rows = append(rows, row)
		}
	}
	return rows
}

// bootRows is the bootstrap CSV: one row per spike client.
func bootRows(cfg spikeConfig, runs map[string][]modeRun) [][]string {
	rows := [][]string{{"mode", "round", "client", "exec_us", "setup_us", "connect_us", "first_lookup_us", "total_us"}}
	u := func(d time.Duration) string { return strconv.FormatInt(d.Microseconds(), 10) }
	for _, m := range cfg.Modes {
		for _, r := range runs[m] {
			for _, b := range r.Boots {
				rows = append(rows, []string{m, strconv.Itoa(r.Round), strconv.FormatUint(b.Client, 10), u(b.Exec), u(b.Setup), u(b.Connect), u(b.First), u(b.Total)})
			}
		}
	}
	return rows
}

func prefixed(p string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = p + n
	}
	return out
}

// writeCSV writes rows to path.
func writeCSV(path string, rows [][]string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	w.WriteAll(rows)
	return errors.Join(w.Error(), f.Close())
}

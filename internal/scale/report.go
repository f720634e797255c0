package scale

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/krcore/krcore/internal/plot"
)

// Main is cmd/krscale: it parses args, runs, prints a table per mode and
// the targets, and draws a PNG per figure into -plots. It returns the
// exit status.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, dir, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "krscale:", err)
		return 2
	}
	cfg.Log = stderr
	tmp, err := os.MkdirTemp("", "krscale-etcd")
	if err != nil {
		fmt.Fprintln(stderr, "krscale:", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	t0 := time.Now()
	stages, err := Run(ctx, cfg, tmp)
	printStages(stdout, cfg, stages)
	if err != nil {
		fmt.Fprintln(stderr, "krscale:", err)
		return 1
	}
	printTargets(stdout, stages)
	if dir != "" {
		if err := drawAll(dir, stages); err != nil {
			fmt.Fprintln(stderr, "krscale:", err)
			return 1
		}
		fmt.Fprintf(stdout, "plots in %s\n", dir)
	}
	fmt.Fprintf(stdout, "run took %v\n", time.Since(t0).Round(time.Second))
	return 0
}

func parseFlags(args []string, stderr io.Writer) (Config, string, error) {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("krscale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sizes := fs.String("sizes", "1000,2000,5000,10000", "cluster sizes, ascending, comma-separated")
	modes := fs.String("modes", ModeDC+","+ModeRC, "modes, comma-separated")
	fs.IntVar(&cfg.Peers, "peers", cfg.Peers, "connects per sample node")
	fs.IntVar(&cfg.Sample, "sample", cfg.Sample, "full runtimes measured at each size")
	fs.IntVar(&cfg.Join, "join", cfg.Join, "nodes joining at once")
	fs.IntVar(&cfg.JoinFull, "join-full", cfg.JoinFull, "of -join, full runtimes (the rest stand in)")
	fs.IntVar(&cfg.Reads, "reads", cfg.Reads, "MetaServer READs timed at each size")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "concurrent etcd registrations while growing")
	dir := fs.String("plots", ".", "directory for the PNG figures (empty: none)")
	if err := fs.Parse(args); err != nil {
		return cfg, "", err
	}
	cfg.Sizes = nil
	for f := range strings.SplitSeq(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return cfg, "", fmt.Errorf("-sizes: %q: %w", f, err)
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}
	cfg.Modes = strings.Split(*modes, ",")
	return cfg, *dir, cfg.Check()
}

func usec(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e3, 'f', 1, 64) }

// printStages writes a table per mode.
func printStages(w io.Writer, cfg Config, stages []Stage) {
	fmt.Fprintf(w, "krscale: %d full runtimes measured per size (the rest stand in: records in etcd and the MetaServer), %d connects each, then %d join at once (%d full)\n",
		cfg.Sample, cfg.Peers, cfg.Join, cfg.JoinFull)
	mode := ""
	for _, s := range stages {
		if s.Mode != mode {
			mode = s.Mode
			fmt.Fprintf(w, "\n%s\n%6s %8s %8s %9s %7s %13s %15s %8s %9s %19s %6s %9s %15s\n", mode,
				"N", "grow", "rebuild", "table KiB", "READ B", "READ p50/p99", "connect p50/p99", "QPs/node", "KiB/node",
				"storm join p50/p99", "failed", "all in", "->joiner p50/99")
		}
		fmt.Fprintf(w, "%6d %8v %8v %9d %7d %13s %15s %8.1f %9.0f %19s %6s %9v %15s\n", s.N,
			s.Grow.Round(time.Millisecond), s.Rebuild.Round(time.Millisecond), s.TableBytes/1024, s.ReadBytes,
			usec(s.Read.P50)+"/"+usec(s.Read.P99), usec(s.Connect.P50)+"/"+usec(s.Connect.P99),
			s.QPs.Mean, s.HeapB/1024, s.JoinFull.P50.Round(time.Millisecond).String()+"/"+s.JoinFull.P99.Round(time.Millisecond).String(),
			strconv.Itoa(s.JoinFailed), s.JoinAll.Round(time.Millisecond), usec(s.JoinConnect.P50)+"/"+usec(s.JoinConnect.P99))
	}
	fmt.Fprintln(w, "(times in us unless marked; KiB/node: Go heap per sample node after its connects)")
}

// printTargets checks issue 18's targets per mode: QPs per node the same
// at every size, and connect p99 at the largest size at most 2x the
// smallest's.
func printTargets(w io.Writer, stages []Stage) {
	groups := byMode(stages)
	for _, mode := range []string{ModeDC, ModeRC} {
		ss := groups[mode]
		if len(ss) == 0 {
			continue
		}
		first, last := ss[0], ss[len(ss)-1]
		lo, hi := first.QPs.Max, first.QPs.Max
		for _, s := range ss {
			lo, hi = min(lo, s.QPs.Max), max(hi, s.QPs.Max)
		}
		ratio := float64(last.Connect.P99) / float64(first.Connect.P99)
		qps := "the target is DC's: an RC QP per peer"
		if mode == ModeDC {
			qps = "target: independent of N: " + verdict(lo == hi)
		}
		fmt.Fprintf(w, "%s: QPs per node (max) %.0f-%.0f from %d to %d nodes (%s); connect p99 at %d %.2fx at %d (target <= 2x: %s)\n",
			mode, lo, hi, first.N, last.N, qps, last.N, ratio, first.N, verdict(ratio <= 2))
	}
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

// byMode groups the stages by mode, in order.
func byMode(stages []Stage) map[string][]Stage {
	m := map[string][]Stage{}
	for _, s := range stages {
		m[s.Mode] = append(m[s.Mode], s)
	}
	return m
}

// figure is one PNG: values of a stage against N, a line per mode and
// curve.
type figure struct {
	file, title, unit string
	curves            []curve
}

// curve is one value of a stage; suffix names it after the mode.
type curve struct {
	suffix string
	value  func(Stage) float64
}

func us(d time.Duration) float64 { return float64(d) / 1e3 }

// one makes a figure of a single value per mode.
func one(file, title, unit string, v func(Stage) float64) figure {
	return figure{file: file, title: title, unit: unit, curves: []curve{{"", v}}}
}

// p50p99 makes a figure of a percentile pair per mode.
func p50p99(file, title string, v func(Stage) Percentiles) figure {
	f := figure{file: file, title: title, unit: "USEC"}
	f.curves = []curve{
		{" p50", func(s Stage) float64 { return us(v(s).P50) }},
		{" p99", func(s Stage) float64 { return us(v(s).P99) }},
	}
	return f
}

var figures = []figure{
	one("scale-qps.png", "QPS PER NODE", "QPS", func(s Stage) float64 { return s.QPs.Mean }),
	one("scale-memory.png", "GO HEAP PER NODE", "KIB", func(s Stage) float64 { return s.HeapB / 1024 }),
	one("scale-table.png", "METASERVER TABLE", "KIB", func(s Stage) float64 { return float64(s.TableBytes) / 1024 }),
	p50p99("scale-read.png", "METASERVER READ", func(s Stage) Percentiles { return s.Read }),
	p50p99("scale-connect.png", "CONNECT", func(s Stage) Percentiles { return s.Connect }),
	p50p99("scale-join.png", "JOIN OF A FULL RUNTIME IN THE STORM", func(s Stage) Percentiles { return s.JoinFull }),
}

// drawAll writes every figure into dir.
func drawAll(dir string, stages []Stage) error {
	groups := byMode(stages)
	for _, f := range figures {
		c := plot.Chart{Title: f.title, XLabel: "NODES", YLabel: f.unit}
		for _, mode := range []string{ModeDC, ModeRC} {
			for _, sr := range f.curves {
				s := plot.Series{Name: mode + sr.suffix}
				for _, st := range groups[mode] {
					s.Points = append(s.Points, plot.Point{X: float64(st.N), Y: sr.value(st)})
				}
				if len(s.Points) > 0 {
					c.Series = append(c.Series, s)
				}
			}
		}
		if err := c.WriteFile(filepath.Join(dir, f.file)); err != nil {
			return err
		}
	}
	return nil
}

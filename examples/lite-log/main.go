// Command lite-log is a distributed atomic log, as LITE (SOSP'17) built
// one: N appender processes add fixed-size records to one log held by the
// coordinator's node, on krcore's lite package, and the same over Go
// net/rpc on TCP between the same processes, in one run:
//
//	go run ./examples/lite-log [-appenders 4] [-records 2000] [-size 64] [-impl both|lite|rpc] [-rounds 3]
//
// With lite the log is an LMR of the coordinator (node 1) whose first word
// is the tail: an appender reserves its record's space with one FetchAdd
// on the tail and writes the record there with one Write, both one-sided
// (litelog.go). With rpc the coordinator serves Log.Append, which appends
// under a mutex (rpclog.go). The appenders (this executable again, nodes
// 2..N+1) start appending together (internal/liteapp steps them); the
// time is from that start until the last one is done. Then the
// coordinator checks the log: exactly every record of every appender,
// once, whole.
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/liteapp"
)

// appendLog is what an appender needs of the log, and the coordinator.
type appendLog interface {
	append(ctx context.Context, rec []byte) error
	contents() []byte // the coordinator's: the records appended so far
	close() error
}

// config is the command line.
type config struct {
	appenders, records, size, rounds int
	impls                            []string
}

// result is one run: its time, and the log it left.
type result struct {
	took time.Duration
	log  []byte
}

func main() {
	liteapp.RunWorker("lite-log", appender)
	cfg := config{}
	flag.IntVar(&cfg.appenders, "appenders", 4, "appender processes")
	flag.IntVar(&cfg.records, "records", 2000, "records each appender appends")
	flag.IntVar(&cfg.size, "size", 64, "bytes per record (at least 16)")
	flag.IntVar(&cfg.rounds, "rounds", 3, "runs per implementation, alternating which goes first; the medians are compared")
	impl := flag.String("impl", "both", "lite, rpc (Go net/rpc over TCP) or both")
	flag.Parse()
	cfg.impls = liteapp.Impls(*impl)
	if cfg.impls == nil || cfg.appenders < 1 || cfg.records < 1 || cfg.size < 16 || cfg.rounds < 1 {
		fmt.Fprintln(os.Stderr, "lite-log: -impl lite|rpc|both, -appenders >= 1, -records >= 1, -size >= 16, -rounds >= 1")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "lite-log:", err)
		os.Exit(1)
	}
}

// run runs the log once per implementation and round, checks every log
// and prints the rates; it returns each implementation's median run.
func run(ctx context.Context, cfg config, out io.Writer) (map[string]result, error) {
	total := cfg.appenders * cfg.records
	fmt.Fprintf(out, "lite-log: %d appender processes x %d records of %d B, %d rounds\n", cfg.appenders, cfg.records, cfg.size, cfg.rounds)
	all, err := liteapp.Alternate(cfg.impls, cfg.rounds, func(impl string, round int) (result, error) {
		r, err := once(ctx, cfg, impl)
		if err == nil {
			err = check(r.log, cfg)
		}
		if err == nil {
			fmt.Fprintf(out, "  round %d %-4s %8v  %8.0f appends/s (log checked: every record once, whole)\n",
				round, impl, r.took.Round(time.Millisecond), float64(total)/r.took.Seconds())
		}
		return r, err
	})
	if err != nil {
		return nil, err
	}
	med := map[string]result{}
	for _, impl := range cfg.impls {
		med[impl] = liteapp.Median(all[impl], func(r result) time.Duration { return r.took })
		fmt.Fprintf(out, "  median  %-4s %8v  %8.0f appends/s\n", impl, med[impl].took.Round(time.Millisecond), float64(total)/med[impl].took.Seconds())
	}
	if len(med) == 2 {
		fmt.Fprintf(out, "  lite / rpc (medians): %.2fx the time\n", med["lite"].took.Seconds()/med["rpc"].took.Seconds())
	}
	return med, nil
}

// once runs the appenders through impl: the coordinator's part.
func once(ctx context.Context, cfg config, impl string) (result, error) {
	capacity := cfg.appenders * cfg.records * cfg.size
	var g appendLog
	var args []string
	switch impl {
	case "lite":
		node, err := liteapp.ProcessNode(ctx, 0, "")
		if err != nil {
			return result{}, err
		}
		defer node.Close()
		lg, err := newLiteLog(ctx, core.Embed(node.Runtime), capacity)
		if err != nil {
			return result{}, err
		}
		g, args = lg, []string{"-impl", "lite", "-meta", node.MetaInfo().String()}
	case "rpc":
		rg, err := newRPCLog(capacity)
		if err != nil {
			return result{}, err
		}
		g, args = rg, []string{"-impl", "rpc", "-addr", rg.ln.Addr().String()}
	}
	defer g.close()
	w, err := liteapp.Start(ctx, cfg.appenders, append(args, "-records", strconv.Itoa(cfg.records), "-size", strconv.Itoa(cfg.size))...)
	if err != nil {
		return result{}, err
	}
	defer w.Close()
	t0 := time.Now()
	if _, err := w.Phase("append"); err != nil {
		return result{}, err
	}
	took := time.Since(t0)
	return result{took: took, log: slices.Clone(g.contents())}, w.Close()
}

// appender is appender process i.
func appender(i int, args []string) error {
	fs := flag.NewFlagSet("appender", flag.ContinueOnError)
	impl := fs.String("impl", "", "lite or rpc")
	metaText := fs.String("meta", "", "the coordinator's MetaServer (lite)")
	addr := fs.String("addr", "", "the coordinator's log (rpc)")
	records := fs.Int("records", 0, "records to append")
	size := fs.Int("size", 0, "bytes per record")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var g appendLog
	switch *impl {
	case "lite":
		node, err := liteapp.ProcessNode(ctx, i, *metaText)
		if err != nil {
			return err
		}
		defer node.Close()
		if g, err = openLiteLog(ctx, core.Embed(node.Runtime)); err != nil {
			return err
		}
	case "rpc":
		var err error
		if g, err = openRPCLog(*addr); err != nil {
			return err
		}
	default:
		return fmt.Errorf("-impl %q", *impl)
	}
	defer g.close()
	rec := make([]byte, *size)
	return liteapp.Serve("", func(string) (string, error) {
		for seq := range *records {
			record(rec, i, seq)
			if err := g.append(ctx, rec); err != nil {
				return "", fmt.Errorf("record %d: %w", seq, err)
			}
		}
		return "", nil
	})
}

// record fills rec as appender i's record seq: i, seq, then i's byte.
func record(rec []byte, i, seq int) {
	binary.LittleEndian.PutUint32(rec, uint32(i))
	binary.LittleEndian.PutUint64(rec[4:], uint64(seq))
	for k := 12; k < len(rec); k++ {
		rec[k] = byte(i)
	}
}

// check verifies the log holds every appender's every record exactly once
// and whole.
func check(log []byte, cfg config) error {
	if want := cfg.appenders * cfg.records * cfg.size; len(log) != want {
		return fmt.Errorf("log of %d bytes, want %d", len(log), want)
	}
	seen := map[[2]int]bool{}
	want := make([]byte, cfg.size)
	for off := 0; off < len(log); off += cfg.size {
		rec := log[off : off+cfg.size]
		i, seq := int(binary.LittleEndian.Uint32(rec)), int(binary.LittleEndian.Uint64(rec[4:]))
		record(want, i, seq)
		switch {
		case i < 1 || i > cfg.appenders || seq < 0 || seq >= cfg.records || string(rec) != string(want):
			return fmt.Errorf("record at %d is torn or foreign: appender %d, record %d", off, i, seq)
		case seen[[2]int{i, seq}]:
			return fmt.Errorf("record %d of appender %d twice (again at %d)", seq, i, off)
		}
		seen[[2]int{i, seq}] = true
	}
	return nil
}

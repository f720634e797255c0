// Command serverless is KRCore's serverless data transfer (ATC'22, §7):
// a function runner starts short-lived function processes, a chain of
// two functions where the producer leaves 1 KiB to 1 MiB of state in its
// memory and the consumer takes it with one RDMA READ, and times every
// invocation end to end with its breakdown: process start, connect,
// transfer. The same chain runs four ways in one run:
//
//	krcored   both functions attach to their node's krcored (two nodes,
//	          served by this runner process); the consumer connects a VQ
//	          (one MetaServer READ) and READs the producer's export
//	embedded  each function starts a soft RNIC and a krcore runtime of its
//	          own, joining the same MetaServer, then as above
//	raw       each function opens a soft RNIC and builds an RC QP itself:
//	          PD, CQ, QP, MR, endpoints exchanged over TCP, RTR/RTS, READ
//	tcp       the consumer dials the producer, which writes the state
//
//	go run ./examples/serverless [-sizes 1024,65536,1048576] [-runs 5] [-modes krcored,embedded,raw,tcp] [-fnprocs 0]
//
// Connect is what a function does to reach the other: attach to krcored
// or start a runtime, Queue, Connect, Region; open the RNIC, create PD,
// CQ and QP, exchange endpoints, RTR/RTS; listen, dial. Register is
// registering memory (and exporting it). Process start is from the
// runner's exec to the function's main (after the Go runtime's and the
// packages' init); transfer is the consumer's READ (or stream read).
// -fnprocs sets the function processes' GOMAXPROCS, as a platform that
// gives a function one CPU would (0: Go's default, every CPU).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/internal/liteapp"
	"github.com/krcore/krcore/internal/perf"
	"github.com/krcore/krcore/meta"
)

// mainAt is when this process reached main: package variables are set
// after every imported package's init.
var mainAt = time.Now()

// config is the runner's command line.
type config struct {
	sizes   []int
	runs    int
	modes   []string
	fnprocs int // the functions' GOMAXPROCS; 0: Go's default
}

// invocation is one run of the chain, as the runner saw it.
type invocation struct {
	e2e, start, connect, register, transfer time.Duration
	attach                                  time.Duration // of connect: attaching to krcored or starting a runtime
}

// other is what the phases leave of the end-to-end time: the producer
// writing the state, the reports to the runner.
func (v invocation) other() time.Duration {
	return v.e2e - v.start - v.connect - v.register - v.transfer
}

// connectShare is connect's part of the end-to-end time.
func (v invocation) connectShare() float64 { return float64(v.connect) / float64(v.e2e) }

func main() {
	liteapp.RunWorker("serverless", function)
	sizes := flag.String("sizes", "1024,65536,1048576", "state sizes in bytes, comma-separated")
	runs := flag.Int("runs", 5, "invocations per mode and size (the modes alternate their order)")
	modes := flag.String("modes", strings.Join(allModes, ","), "modes, comma-separated")
	fnprocs := flag.Int("fnprocs", 0, "GOMAXPROCS of the function processes (0: Go's default)")
	flag.Parse()
	cfg, err := parseConfig(*sizes, *runs, *modes, *fnprocs)
	if err != nil {
		fmt.Fprintln(os.Stderr, "serverless:", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "serverless:", err)
		os.Exit(1)
	}
}

var allModes = []string{modeDaemon, modeEmbedded, modeRaw, modeTCP}

func parseConfig(sizes string, runs int, modes string, fnprocs int) (config, error) {
	cfg := config{runs: runs, fnprocs: fnprocs}
	for f := range strings.SplitSeq(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 1<<30 {
			return cfg, fmt.Errorf("-sizes: %q is not a size in 1..1 GiB", f)
		}
		cfg.sizes = append(cfg.sizes, n)
	}
	for m := range strings.SplitSeq(modes, ",") {
		if !slices.Contains(allModes, m) {
			return cfg, fmt.Errorf("-modes: %q is none of %v", m, allModes)
		}
		cfg.modes = append(cfg.modes, m)
	}
	if runs < 1 {
		return cfg, fmt.Errorf("-runs %d: want at least 1", runs)
	}
	if fnprocs < 0 || fnprocs > 1024 {
		return cfg, fmt.Errorf("-fnprocs %d: want 0 (Go's default) to 1024", fnprocs)
	}
	return cfg, nil
}

// runner is the function runner: the two krcored nodes the functions
// attach to (node 1 with the MetaServer), and the invocations so far.
type runner struct {
	nodes   [2]*daemon.Node
	socks   [2]string
	stop    context.CancelFunc
	done    chan error
	seq     int
	fnprocs int // the functions' GOMAXPROCS; 0: Go's default
}

// startRunner starts krcored for nodes 1 and 2 in this process, on soft
// RNICs reachable from other processes, with their sockets in dir.
func startRunner(ctx context.Context, dir string) (*runner, error) {
	r := &runner{done: make(chan error, 2)}
	sctx, stop := context.WithCancel(context.Background())
	r.stop = stop
	var metas []meta.Info
	for i := range r.nodes {
		r.socks[i] = filepath.Join(dir, fmt.Sprintf("krcored%d.sock", i+1))
		n, err := daemon.Start(ctx, daemon.NodeConfig{
			Config: daemon.Config{Socket: r.socks[i], Logger: slog.New(slog.DiscardHandler)},
			Node:   nodeID(i), Meta: metas, Device: daemon.DeviceConfig{Listen: "127.0.0.1:0"},
		})
		if err != nil {
			r.close()
			return nil, fmt.Errorf("krcored node %d: %w", i+1, err)
		}
		r.nodes[i] = n
		go func() { r.done <- n.Serve(sctx) }()
		metas = []meta.Info{n.Runtime().MetaInfo()}
	}
	return r, nil
}

// nodeID is the id of runner node i (0 or 1).
func nodeID(i int) krcore.NodeID { return krcore.NodeID(i + 1) }

func (r *runner) close() {
	r.stop()
	for _, n := range r.nodes {
		if n != nil {
			<-r.done
			n.Close()
		}
	}
}

// invoke runs the chain once in mode with size bytes of state.
func (r *runner) invoke(ctx context.Context, mode string, size int) (invocation, error) {
	r.seq++
	name := fmt.Sprintf("state-%d", r.seq)
	common := []string{"-mode", mode, "-size", strconv.Itoa(size), "-seed", strconv.Itoa(r.seq), "-name", name,
		"-meta", r.nodes[0].Runtime().MetaInfo().String(), "-procs", strconv.Itoa(r.fnprocs)}
	// Embedded functions are nodes of their own: fresh ids, never reused
	// while a dead one's record may linger.
	pid, cid := 1000+2*r.seq, 1001+2*r.seq
	t0 := time.Now()
	prod, pr, err := startFn(ctx, append(common, "-role", "producer", "-sock", r.socks[0], "-node", strconv.Itoa(pid))...)
	if err != nil {
		return invocation{}, fmt.Errorf("producer: %w", err)
	}
	t1 := time.Now()
	cons, cr, err := startFn(ctx, append(common, "-role", "consumer", "-sock", r.socks[1], "-addr", pr.Addr,
		"-node", strconv.Itoa(cid), "-peer", strconv.Itoa(peerOf(mode, pid)))...)
	end := time.Now()
	if err == nil {
		err = cons.Close()
	}
	if err != nil {
		prod.Close()
		return invocation{}, fmt.Errorf("consumer: %w", err)
	}
	if err := prod.Close(); err != nil {
		return invocation{}, fmt.Errorf("producer: %w", err)
	}
	if want := r.wantProcs(); pr.Procs != want || cr.Procs != want {
		return invocation{}, fmt.Errorf("the functions ran with GOMAXPROCS %d and %d, want %d", pr.Procs, cr.Procs, want)
	}
	return invocation{
		e2e:      end.Sub(t0),
		start:    time.Duration(pr.Main-t0.UnixNano()) + time.Duration(cr.Main-t1.UnixNano()),
		connect:  time.Duration(pr.Connect + cr.Connect),
		attach:   time.Duration(pr.Attach + cr.Attach),
		register: time.Duration(pr.Register + cr.Register),
		transfer: time.Duration(cr.Transfer),
	}, nil
}

// wantProcs is the GOMAXPROCS the functions run with: -fnprocs, or Go's
// default, which this process has too.
func (r *runner) wantProcs() int {
	if r.fnprocs > 0 {
		return r.fnprocs
	}
	return runtime.GOMAXPROCS(0)
}

// peerOf is the node the consumer connects to: the producer's krcored
// (node 1), or the producer's own node when it embeds a runtime.
func peerOf(mode string, producer int) int {
	if mode == modeEmbedded {
		return producer
	}
	return int(nodeID(0))
}

// startFn starts one function process and returns it once it said its
// report.
func startFn(ctx context.Context, args ...string) (*liteapp.Workers, report, error) {
	w, err := liteapp.Start(ctx, 1, args...)
	if err != nil {
		return nil, report{}, err
	}
	var r report
	if err := json.Unmarshal([]byte(w.Addrs[0]), &r); err != nil {
		w.Close()
		return nil, r, fmt.Errorf("report %q: %w", w.Addrs[0], err)
	}
	return w, r, nil
}

// parseFn reads a function process's command line.
func parseFn(argv []string) (fnArgs, error) {
	fs := flag.NewFlagSet("function", flag.ContinueOnError)
	var a fnArgs
	fs.StringVar(&a.role, "role", "", "producer or consumer")
	fs.StringVar(&a.mode, "mode", "", "the chain's mode")
	fs.StringVar(&a.sock, "sock", "", "krcored's socket (krcored)")
	fs.StringVar(&a.meta, "meta", "", "the MetaServer (embedded)")
	fs.StringVar(&a.name, "name", "", "the state's export name")
	fs.StringVar(&a.addr, "addr", "", "the producer's TCP address (raw, tcp)")
	fs.IntVar(&a.size, "size", 0, "state bytes")
	fs.IntVar(&a.node, "node", 0, "this function's node id (embedded)")
	fs.IntVar(&a.peer, "peer", 0, "the producer's node id")
	fs.Uint64Var(&a.seed, "seed", 0, "the state's seed")
	fs.IntVar(&a.procs, "procs", 0, "GOMAXPROCS (0: Go's default)")
	if err := fs.Parse(argv); err != nil {
		return a, err
	}
	if a.role != "producer" && a.role != "consumer" || !slices.Contains(allModes, a.mode) || a.size < 1 || a.procs < 0 {
		return a, fmt.Errorf("function: -role %q -mode %q -size %d -procs %d", a.role, a.mode, a.size, a.procs)
	}
	return a, nil
}

// result is one mode and size's invocations.
type result struct {
	mode string
	size int
	runs []invocation
}

// median is the invocation of median end-to-end time.
func (r result) median() invocation {
	return liteapp.Median(slices.Clone(r.runs), func(v invocation) time.Duration { return v.e2e })
}

// run runs every mode and size cfg.runs times and prints the medians.
func run(ctx context.Context, cfg config, out io.Writer) ([]result, error) {
	dir, err := os.MkdirTemp("", "serverless")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	r, err := startRunner(ctx, dir)
	if err != nil {
		return nil, err
	}
	defer r.close()
	r.fnprocs = cfg.fnprocs
	var results []result
	for _, size := range cfg.sizes {
		all, err := liteapp.Alternate(cfg.modes, cfg.runs, func(mode string, _ int) (invocation, error) {
			return r.invoke(ctx, mode, size)
		})
		if err != nil {
			return nil, fmt.Errorf("%d B: %w", size, err)
		}
		for _, mode := range cfg.modes {
			results = append(results, result{mode: mode, size: size, runs: all[mode]})
		}
	}
	printTable(out, cfg, results)
	return results, nil
}

// printTable writes the medians' table.
func printTable(out io.Writer, cfg config, results []result) {
	procs := "Go's default"
	if cfg.fnprocs > 0 {
		procs = strconv.Itoa(cfg.fnprocs)
	}
	fmt.Fprintf(out, "serverless: a chain of 2 function processes (GOMAXPROCS %s), %d invocations per mode and size (medians by end-to-end time; every state checked)\n", procs, cfg.runs)
	fmt.Fprintf(out, "%-9s %6s %10s %10s %10s %10s %10s %10s %10s %8s\n", "mode", "state", "e2e", "start", "connect", "(attach)", "register", "transfer", "other", "connect%")
	ms := func(d time.Duration) string { return fmt.Sprintf("%.3fms", float64(d)/1e6) }
	for _, res := range results {
		v := res.median()
		fmt.Fprintf(out, "%-9s %6s %10s %10s %10s %10s %10s %10s %10s %7.2f%%\n", res.mode, perf.SizeName(res.size),
			ms(v.e2e), ms(v.start), ms(v.connect), ms(v.attach), ms(v.register), ms(v.transfer), ms(v.other()), 100*v.connectShare())
	}
}

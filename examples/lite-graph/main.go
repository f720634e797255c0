// Command lite-graph is PageRank over a generated power-law graph
// partitioned over N worker processes, LITE's (SOSP'17) graph engine on
// krcore's lite package, and the same engine over Go net/rpc on TCP
// between the same processes, in one run:
//
//	go run ./examples/lite-graph [-workers 4] [-vertices 200000] [-edges 2000000] [-iters 20] [-impl both|lite|rpc] [-rounds 3]
//
// Every process generates the same graph from the seed; worker p (node p+1)
// owns a range of vertices and keeps their in-edges. Each iteration a
// worker reads every other partition's ranks of the last iteration,
// computes its own vertices' next ranks (pull: the sum over in-edges of
// rank/out-degree, plus the dangling vertices' rank spread over all) and
// publishes them. With lite the ranks travel through LMRs: each worker
// writes its ranks into its own LMR and the others read them with
// one-sided RDMA (liteexchange.go); with rpc each worker serves its ranks
// over net/rpc (rpcexchange.go). After each iteration the workers meet at
// a barrier (lite's Barrier, or a net/rpc one the coordinator serves), so
// no one overwrites ranks another still reads. The run starts and ends by
// lines on the workers' standard input and output (internal/liteapp),
// alike for both. The result is checked against a single-process
// computation.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/liteapp"
)

// exchange shares each iteration's ranks between the processes: a worker
// sets its partition's slot (iteration parity); anyone gets worker q's.
type exchange interface {
	set(slot int, dangling float64, ranks []float64)
	get(ctx context.Context, q, slot int, ranks []float64) (dangling float64, err error)
	// barrier returns once n workers called it with name (the coordinator
	// keeps it).
	barrier(ctx context.Context, name string, n int) error
	close() error
}

// config is the command line.
type config struct {
	workers, vertices, edges, iters, rounds int
	seed                                    uint64
	impls                                   []string
}

// result is one run: its time, the time moving ranks, and the ranks.
type result struct {
	took, moved time.Duration
	ranks       []float64
}

// tolerance bounds a rank's difference from the single-process one.
const tolerance = 1e-12

func main() {
	liteapp.RunWorker("lite-graph", worker)
	cfg := config{}
	flag.IntVar(&cfg.workers, "workers", 4, "worker processes")
	flag.IntVar(&cfg.vertices, "vertices", 200000, "vertices")
	flag.IntVar(&cfg.edges, "edges", 2000000, "edges drawn (self-loops are dropped)")
	flag.IntVar(&cfg.iters, "iters", 20, "PageRank iterations")
	flag.IntVar(&cfg.rounds, "rounds", 3, "runs per implementation, alternating which goes first; the medians are compared")
	flag.Uint64Var(&cfg.seed, "seed", 1, "the graph's random seed")
	impl := flag.String("impl", "both", "lite, rpc (Go net/rpc over TCP) or both")
	flag.Parse()
	cfg.impls = liteapp.Impls(*impl)
	if cfg.impls == nil || cfg.workers < 1 || cfg.vertices < cfg.workers || cfg.edges < 1 || cfg.iters < 1 || cfg.rounds < 1 {
		fmt.Fprintln(os.Stderr, "lite-graph: -impl lite|rpc|both, -workers >= 1, -vertices >= -workers, -edges, -iters, -rounds >= 1")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "lite-graph:", err)
		os.Exit(1)
	}
}

// run runs PageRank once per implementation and round, checks every
// result against the single-process one and prints the times; it returns
// each implementation's median run.
func run(ctx context.Context, cfg config, out io.Writer) (map[string]result, error) {
	want := pagerank(cfg.seed, cfg.vertices, cfg.edges, cfg.iters)
	fmt.Fprintf(out, "lite-graph: PageRank, %d vertices, %d edges drawn (power law), %d iterations, %d worker processes, %d rounds\n",
		cfg.vertices, cfg.edges, cfg.iters, cfg.workers, cfg.rounds)
	all, err := liteapp.Alternate(cfg.impls, cfg.rounds, func(impl string, round int) (result, error) {
		r, err := once(ctx, cfg, impl)
		if err != nil {
			return r, err
		}
		if d := maxDiff(r.ranks, want); d > tolerance {
			return r, fmt.Errorf("ranks differ from the single-process ones by up to %g", d)
		}
		fmt.Fprintf(out, "  round %d %-4s %8v, of which moving ranks %8v (ranks equal a single-process run within %g)\n",
			round, impl, r.took.Round(time.Millisecond), r.moved.Round(time.Millisecond), tolerance)
		return r, nil
	})
	if err != nil {
		return nil, err
	}
	med := map[string]result{}
	for _, impl := range cfg.impls {
		med[impl] = liteapp.Median(all[impl], func(r result) time.Duration { return r.took })
		fmt.Fprintf(out, "  median  %-4s %8v, of which moving ranks %8v\n", impl, med[impl].took.Round(time.Millisecond), med[impl].moved.Round(time.Millisecond))
	}
	if len(med) == 2 {
		l, r := med["lite"], med["rpc"]
		fmt.Fprintf(out, "  lite / rpc (medians): %.2fx the iterations, %.2fx moving ranks\n",
			l.took.Seconds()/r.took.Seconds(), l.moved.Seconds()/r.moved.Seconds())
	}
	return med, nil
}

// once runs PageRank through impl: the coordinator's part. The time runs
// from the first iteration to the last, with the final ranks gathered.
func once(ctx context.Context, cfg config, impl string) (result, error) {
	x, self, args, stop, err := openExchange(ctx, cfg, impl, 0, "")
	if err != nil {
		return result{}, err
	}
	defer stop()
	w, err := liteapp.Start(ctx, cfg.workers, append(args, "-workers", strconv.Itoa(cfg.workers), "-vertices", strconv.Itoa(cfg.vertices),
		"-edges", strconv.Itoa(cfg.edges), "-seed", strconv.FormatUint(cfg.seed, 10), "-iters", strconv.Itoa(cfg.iters))...)
	if err != nil {
		return result{}, err
	}
	defer w.Close()
	addrs := strings.Join(append([]string{self}, w.Addrs...), ",")
	setPeers(x, addrs)
	var res result
	t0 := time.Now()
	said, err := w.Phase("run " + addrs)
	if err != nil {
		return result{}, err
	}
	res.moved = liteapp.Slowest(said)
	res.ranks = make([]float64, cfg.vertices)
	for q := 1; q <= cfg.workers; q++ {
		lo, hi := partition(cfg.vertices, cfg.workers, q)
		t := time.Now()
		if _, err := x.get(ctx, q, cfg.iters%2, res.ranks[lo:hi]); err != nil {
			return result{}, fmt.Errorf("final ranks of worker %d: %w", q, err)
		}
		res.moved += time.Since(t)
	}
	res.took = time.Since(t0)
	return res, w.Close()
}

// worker is worker process i: it generates the graph, keeps its
// partition's in-edges, publishes the uniform ranks and runs iterations.
func worker(i int, args []string) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	var cfg config
	impl := fs.String("impl", "", "lite or rpc")
	metaText := fs.String("meta", "", "the coordinator's MetaServer (lite)")
	fs.IntVar(&cfg.workers, "workers", 0, "worker processes")
	fs.IntVar(&cfg.vertices, "vertices", 0, "vertices")
	fs.IntVar(&cfg.edges, "edges", 0, "edges")
	fs.Uint64Var(&cfg.seed, "seed", 0, "seed")
	fs.IntVar(&cfg.iters, "iters", 0, "iterations")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	lo, hi := partition(cfg.vertices, cfg.workers, i)
	g := generate(cfg.seed, cfg.vertices, cfg.edges, lo, hi)
	x, self, _, stop, err := openExchange(ctx, cfg, *impl, i, *metaText)
	if err != nil {
		return err
	}
	defer stop()
	rank, mine := make([]float64, cfg.vertices), make([]float64, hi-lo)
	for v := range mine {
		mine[v] = 1 / float64(cfg.vertices)
	}
	x.set(0, g.danglingOf(lo, mine), mine)
	return liteapp.Serve(self, func(line string) (string, error) {
		run, addrs, _ := strings.Cut(line, " ")
		if run != "run" {
			return "", fmt.Errorf("unknown command %q", line)
		}
		setPeers(x, addrs)
		var spent time.Duration
		for k := range cfg.iters {
			d, err := iteration(ctx, cfg, x, g, i, k, rank, mine)
			spent += d
			if err != nil {
				return "", fmt.Errorf("iteration %d: %w", k, err)
			}
			if err := x.barrier(ctx, "iteration", cfg.workers); err != nil {
				return "", fmt.Errorf("barrier after iteration %d: %w", k, err)
			}
		}
		return spent.String(), nil
	})
}

// iteration is worker i's iteration k: it reads the other partitions'
// ranks of slot k%2 into rank, computes its own (mine) and publishes them
// in slot (k+1)%2. It returns the time spent moving ranks.
func iteration(ctx context.Context, cfg config, x exchange, g *graph, i, k int, rank, mine []float64) (time.Duration, error) {
	var spent time.Duration
	dangling := g.danglingOf(g.lo, mine)
	copy(rank[g.lo:g.hi], mine)
	for q := 1; q <= cfg.workers; q++ {
		if q == i {
			continue
		}
		qlo, qhi := partition(cfg.vertices, cfg.workers, q)
		t := time.Now()
		d, err := x.get(ctx, q, k%2, rank[qlo:qhi])
		spent += time.Since(t)
		if err != nil {
			return spent, fmt.Errorf("ranks of worker %d: %w", q, err)
		}
		dangling += d
	}
	g.step(rank, dangling, mine)
	t := time.Now()
	x.set((k+1)%2, g.danglingOf(g.lo, mine), mine)
	return spent + time.Since(t), nil
}

// openExchange opens process p's exchange for impl. For lite it starts the
// process's node (node p+1; the coordinator's embeds the MetaServer, whose
// text it passes to the workers in args); for rpc it listens, and self is
// its address.
func openExchange(ctx context.Context, cfg config, impl string, p int, metaText string) (x exchange, self string, args []string, stop func(), err error) {
	count := 0
	if p > 0 {
		lo, hi := partition(cfg.vertices, cfg.workers, p)
		count = hi - lo
	}
	switch impl {
	case "rpc":
		r, err := newRPCExchange()
		if err != nil {
			return nil, "", nil, nil, err
		}
		return r, r.ln.Addr().String(), []string{"-impl", "rpc"}, func() { r.close() }, nil
	case "lite":
		node, err := liteapp.ProcessNode(ctx, p, metaText)
		if err != nil {
			return nil, "", nil, nil, err
		}
		size := func(q int) int { lo, hi := partition(cfg.vertices, cfg.workers, q); return hi - lo }
		l, err := newLiteExchange(ctx, core.Embed(node.Runtime), count, size)
		if err != nil {
			node.Close()
			return nil, "", nil, nil, err
		}
		return l, "", []string{"-impl", "lite", "-meta", node.MetaInfo().String()}, func() { l.close(); node.Close() }, nil
	}
	return nil, "", nil, nil, errors.New("-impl is lite or rpc")
}

// setPeers tells an rpc exchange where the processes listen.
func setPeers(x exchange, addrs string) {
	if r, ok := x.(*rpcExchange); ok {
		r.peers.Addrs = strings.Split(addrs, ",")
	}
}

// maxDiff is the largest difference between a and b, element by element.
func maxDiff(a, b []float64) float64 {
	var d float64
	for i := range a {
		d = max(d, math.Abs(a[i]-b[i]))
	}
	return d
}

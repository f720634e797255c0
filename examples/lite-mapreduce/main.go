// Command lite-mapreduce counts words over N worker processes, the
// MapReduce of LITE (SOSP'17) on krcore, and the same job over Go net/rpc
// on TCP between the same processes, in one run:
//
//	go run ./examples/lite-mapreduce [-workers 4] [-words 1000000] [-impl both|lite|rpc]
//
// The coordinator (this process, node 1) generates a text with a power-law
// vocabulary, splits it in one input per worker and publishes them; it
// starts the worker processes (this executable again, nodes 2..N+1). In
// the map phase worker i fetches input i, counts its words and publishes
// its counts cut in N partitions, one per reducer; in the reduce phase
// worker r fetches partition r of every worker, adds them up and publishes
// the sum, which the coordinator fetches. With -impl lite a value is an
// LMR its producer mallocs and a consumer maps by name and reads with
// one-sided RDMA (litestore.go); with -impl rpc a value is served by its
// producer over net/rpc (rpcstore.go). Between map and reduce the workers
// meet at a barrier: a lite Barrier mastered by the coordinator's node, or
// a net/rpc call the coordinator answers once every worker made it. The
// job starts and ends by lines on the workers' standard input and output
// (internal/liteapp), alike for both; the time is from the start to the
// last output read.
// Every result is checked against a direct count of the text.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/liteapp"
)

// store moves the job's values between its processes: a process publishes
// a value under a name; any process fetches it from its owner (process 0
// is the coordinator, 1..N the workers).
type store interface {
	publish(ctx context.Context, name string, data []byte) error
	fetch(ctx context.Context, owner int, name string) ([]byte, error)
	// barrier returns once n workers called it with name (the coordinator
	// keeps it).
	barrier(ctx context.Context, name string, n int) error
	close() error
}

// config is the command line.
type config struct {
	workers, words, vocab int
	rounds                int
	seed                  uint64
	impls                 []string
}

// timedStore adds up the time spent in a store's calls.
type timedStore struct {
	store
	spent time.Duration
}

func (t *timedStore) publish(ctx context.Context, name string, data []byte) error {
	defer t.clock(time.Now())
	return t.store.publish(ctx, name, data)
}

func (t *timedStore) fetch(ctx context.Context, owner int, name string) ([]byte, error) {
	defer t.clock(time.Now())
	return t.store.fetch(ctx, owner, name)
}

func (t *timedStore) clock(t0 time.Time) { t.spent += time.Since(t0) }

// result is one job's outcome: its time, and of that the time spent moving
// data (the slowest worker's, and the coordinator's fetches).
type result struct {
	impl        string
	took, moved time.Duration
	counts      counts
}

func main() {
	liteapp.RunWorker("lite-mapreduce", worker)
	cfg := config{}
	flag.IntVar(&cfg.workers, "workers", 4, "worker processes")
	flag.IntVar(&cfg.words, "words", 1000000, "words of input")
	flag.IntVar(&cfg.vocab, "vocab", 50000, "distinct words the input draws from")
	flag.Uint64Var(&cfg.seed, "seed", 1, "input's random seed")
	flag.IntVar(&cfg.rounds, "rounds", 3, "jobs per implementation, alternating which goes first; the medians are compared")
	impl := flag.String("impl", "both", "lite, rpc (Go net/rpc over TCP) or both")
	flag.Parse()
	cfg.impls = liteapp.Impls(*impl)
	if cfg.impls == nil || cfg.workers < 1 || cfg.words < 1 || cfg.vocab < 2 || cfg.rounds < 1 {
		fmt.Fprintln(os.Stderr, "lite-mapreduce: -impl lite|rpc|both, -workers >= 1, -words >= 1, -vocab >= 2, -rounds >= 1")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "lite-mapreduce:", err)
		os.Exit(1)
	}
}

// run runs the job once per implementation, checks each result against a
// direct count and prints the times.
func run(ctx context.Context, cfg config, out io.Writer) ([]result, error) {
	text := generate(cfg.seed, cfg.words, cfg.vocab)
	want := count(text)
	fmt.Fprintf(out, "lite-mapreduce: %d words (%.1f MB, %d distinct), %d worker processes, %d rounds\n",
		cfg.words, float64(len(text))/1e6, len(want), cfg.workers, cfg.rounds)
	all, err := liteapp.Alternate(cfg.impls, cfg.rounds, func(impl string, round int) (result, error) {
		r, err := job(ctx, cfg, impl, text)
		if err != nil {
			return r, err
		}
		if !maps.Equal(r.counts, want) {
			return r, errors.New("the counts differ from a direct count")
		}
		fmt.Fprintf(out, "  round %d %-4s %8v, of which moving data %8v (counts equal a direct count)\n",
			round, impl, r.took.Round(time.Millisecond), r.moved.Round(time.Millisecond))
		return r, nil
	})
	if err != nil {
		return nil, err
	}
	var med []result
	for _, impl := range cfg.impls {
		m := liteapp.Median(all[impl], func(r result) time.Duration { return r.took })
		med = append(med, m)
		fmt.Fprintf(out, "  median   %-4s %8v, of which moving data %8v\n", impl, m.took.Round(time.Millisecond), m.moved.Round(time.Millisecond))
	}
	if len(med) == 2 {
		fmt.Fprintf(out, "  lite / rpc (medians): %.2fx the job, %.2fx moving data\n",
			med[0].took.Seconds()/med[1].took.Seconds(), med[0].moved.Seconds()/med[1].moved.Seconds())
	}
	return med, nil
}

// job runs the word count through impl: the coordinator's part.
func job(ctx context.Context, cfg config, impl string, text []byte) (result, error) {
	st, self, args, stop, err := openStore(ctx, impl, 0, "")
	if err != nil {
		return result{}, err
	}
	defer stop()
	for i, part := range split(text, cfg.workers) {
		if err := st.publish(ctx, "input/"+strconv.Itoa(i+1), part); err != nil {
			return result{}, err
		}
	}
	w, err := liteapp.Start(ctx, cfg.workers, append(args, "-workers", strconv.Itoa(cfg.workers))...)
	if err != nil {
		return result{}, err
	}
	defer w.Close()
	addrs := strings.Join(append([]string{self}, w.Addrs...), ",")
	setPeers(st, addrs)
	res := result{impl: impl, counts: counts{}}
	t0 := time.Now()
	said, err := w.Phase("run " + addrs)
	if err != nil {
		return result{}, err
	}
	res.moved = liteapp.Slowest(said)
	ts := &timedStore{store: st}
	for r := 1; r <= cfg.workers; r++ {
		c, err := fetchCounts(ctx, ts, r, "output/"+strconv.Itoa(r))
		if err != nil {
			return result{}, err
		}
		res.counts.add(c)
	}
	res.took, res.moved = time.Since(t0), res.moved+ts.spent
	return res, w.Close()
}

// worker is worker process i.
func worker(i int, args []string) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	impl := fs.String("impl", "", "lite or rpc")
	metaText := fs.String("meta", "", "the coordinator's MetaServer (lite)")
	n := fs.Int("workers", 0, "worker processes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	raw, self, _, stop, err := openStore(ctx, *impl, i, *metaText)
	if err != nil {
		return err
	}
	defer stop()
	st := &timedStore{store: raw}
	return liteapp.Serve(self, func(line string) (string, error) {
		run, addrs, _ := strings.Cut(line, " ")
		if run != "run" {
			return "", fmt.Errorf("unknown command %q", line)
		}
		setPeers(raw, addrs)
		st.spent = 0
		err := mapReduce(ctx, st, i, *n)
		return st.spent.String(), err
	})
}

// mapReduce is worker i of n's job: map, wait at the barrier until every
// worker mapped, reduce.
func mapReduce(ctx context.Context, st *timedStore, i, n int) error {
	me := strconv.Itoa(i)
	input, err := st.fetch(ctx, 0, "input/"+me)
	if err != nil {
		return err
	}
	for r, part := range partition(count(input), n) {
		if err := st.publish(ctx, fmt.Sprintf("map/%s/%d", me, r+1), part.encode()); err != nil {
			return err
		}
	}
	if err := st.barrier(ctx, "mapped", n); err != nil {
		return fmt.Errorf("barrier after map: %w", err)
	}
	sum := counts{}
	for m := 1; m <= n; m++ {
		c, err := fetchCounts(ctx, st, m, fmt.Sprintf("map/%d/%s", m, me))
		if err != nil {
			return err
		}
		sum.add(c)
	}
	return st.publish(ctx, "output/"+me, sum.encode())
}

// fetchCounts fetches the counts owner published as name.
func fetchCounts(ctx context.Context, st store, owner int, name string) (counts, error) {
	data, err := st.fetch(ctx, owner, name)
	if err != nil {
		return nil, fmt.Errorf("fetch %s from %d: %w", name, owner, err)
	}
	return decode(data)
}

// openStore opens process p's store for impl. For lite it starts the
// process's node (node p+1; the coordinator's embeds the MetaServer, whose
// text it passes to the workers in args); for rpc it listens, and self is
// its address.
func openStore(ctx context.Context, impl string, p int, metaText string) (st store, self string, args []string, stop func(), err error) {
	switch impl {
	case "rpc":
		s, err := newRPCStore()
		if err != nil {
			return nil, "", nil, nil, err
		}
		return s, s.ln.Addr().String(), []string{"-impl", "rpc"}, func() { s.close() }, nil
	case "lite":
		node, err := liteapp.ProcessNode(ctx, p, metaText)
		if err != nil {
			return nil, "", nil, nil, err
		}
		s, err := newLiteStore(ctx, core.Embed(node.Runtime))
		if err != nil {
			node.Close()
			return nil, "", nil, nil, err
		}
		args := []string{"-impl", "lite", "-meta", node.MetaInfo().String()}
		return s, "", args, func() { s.close(); node.Close() }, nil
	}
	return nil, "", nil, nil, errors.New("-impl is lite or rpc")
}

// setPeers tells an rpc store where the processes listen ("addr0,addr1,...").
func setPeers(st store, addrs string) {
	if s, ok := st.(*rpcStore); ok {
		s.peers.Addrs = strings.Split(addrs, ",")
	}
}

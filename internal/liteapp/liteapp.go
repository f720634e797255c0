// Package liteapp is the process harness of the lite example applications
// (examples/lite-*): a coordinator process starts N worker processes of
// its own executable, steps them through the job's phases by lines on
// their standard input and output, and each process brings up its krcore
// node (a soft RNIC on loopback TCP and an embedded runtime, the
// coordinator's with the MetaServer). The applications' data moves through
// package lite, or through Go net/rpc in their comparison runs; only the
// phase steps go through these pipes, alike for both.
package liteapp

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/rpc"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// workerEnv holds a worker process's index (1..N), set by Start.
const workerEnv = "LITEAPP_WORKER"

// Worker reports the index (1..N) this process was started with by
// Start, and whether it is a worker at all.
func Worker() (int, bool) {
	i, err := strconv.Atoi(os.Getenv(workerEnv))
	return i, err == nil && i > 0
}

// Node is a process's krcore node: an RNIC (StartNode's a soft one on
// loopback TCP) and a runtime with the given id, joining metas (none: it embeds the
// MetaServer, see Runtime.MetaInfo).
type Node struct {
	*core.Runtime
	dev verbs.Device
}

// StartNode starts this process's node.
func StartNode(ctx context.Context, id krcore.NodeID, metas []meta.Info) (*Node, error) {
	dev, err := soft.NewNode(soft.Config{Listen: "127.0.0.1:0"})
	if err != nil {
		return nil, err
	}
	return StartNodeWith(ctx, core.Config{Device: dev, Node: id, Meta: metas})
}

// StartNodeWith starts this process's node as cfg says. cfg.Device is an
// RNIC the caller opened (a real one through provider/ibverbs, say),
// which the Node owns: it is closed on Close, or when the start fails. A
// nil cfg.Logger discards the runtime's log.
func StartNodeWith(ctx context.Context, cfg core.Config) (*Node, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	rt, err := core.New(ctx, cfg)
	if err != nil {
		cfg.Device.Close()
		return nil, fmt.Errorf("node %d: %w", cfg.Node, err)
	}
	return &Node{Runtime: rt, dev: cfg.Device}, nil
}

// Device is the node's RNIC, for verbs objects beside the runtime's.
func (n *Node) Device() verbs.Device { return n.dev }

// Close stops the runtime and the RNIC.
func (n *Node) Close() error {
	return errors.Join(n.Runtime.Close(), n.dev.Close())
}

// Workers are the worker processes a coordinator started.
type Workers struct {
	cmds  []*exec.Cmd
	ins   []io.WriteCloser
	outs  []*bufio.Reader
	Addrs []string // what each worker said when ready (index i-1)
}

// Start starts n worker processes of this executable with args, each with
// its index in its environment (Worker), and waits until each says it is
// ready (Ready), collecting what they said.
func Start(ctx context.Context, n int, args ...string) (*Workers, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	w := &Workers{}
	for i := 1; i <= n; i++ {
		cmd := exec.CommandContext(ctx, exe, args...)
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", workerEnv, i))
		cmd.Stderr = os.Stderr
		in, err1 := cmd.StdinPipe()
		out, err2 := cmd.StdoutPipe()
		if err := errors.Join(err1, err2); err != nil {
			w.Close()
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			w.Close()
			return nil, fmt.Errorf("start worker %d: %w", i, err)
		}
		w.cmds, w.ins, w.outs = append(w.cmds, cmd), append(w.ins, in), append(w.outs, bufio.NewReader(out))
	}
	for i := range w.outs {
		said, err := w.expect(i, "ready")
		if err != nil {
			w.Close()
			return nil, err
		}
		w.Addrs = append(w.Addrs, said)
	}
	return w, nil
}

// expect reads worker i's next line, which must start with word; it
// returns the rest.
func (w *Workers) expect(i int, word string) (string, error) {
	line, err := w.outs[i].ReadString('\n')
	rest, ok := strings.CutPrefix(strings.TrimSpace(line), word)
	if err != nil || !ok {
		return "", fmt.Errorf("worker %d: said %q, want %q: %v", i+1, line, word, err)
	}
	return strings.TrimSpace(rest), nil
}

// Phase tells every worker to run the phase named by line and waits until
// every one says it is done; it returns what each said with it.
func (w *Workers) Phase(line string) ([]string, error) {
	for i, in := range w.ins {
		if _, err := io.WriteString(in, line+"\n"); err != nil {
			return nil, fmt.Errorf("worker %d: %w", i+1, err)
		}
	}
	said := make([]string, len(w.outs))
	for i := range w.outs {
		var err error
		if said[i], err = w.expect(i, "done"); err != nil {
			return nil, err
		}
	}
	return said, nil
}

// Close closes the workers' standard input, which ends them, and waits
// for them to exit.
func (w *Workers) Close() error {
	var errs []error
	for _, in := range w.ins {
		in.Close()
	}
	for i, cmd := range w.cmds {
		if err := cmd.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("worker %d: %w", i+1, err))
		}
	}
	return errors.Join(errs...)
}

// Serve is a worker's loop: it says ready with addr (what the others need
// to reach it, possibly empty), then runs phase for every line the
// coordinator sends and says done after each, with what phase returned,
// until the coordinator closes the pipe.
func Serve(addr string, phase func(line string) (string, error)) error {
	in := bufio.NewReader(os.Stdin)
	fmt.Fprintln(os.Stdout, "ready", addr)
	for {
		line, err := in.ReadString('\n')
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		said, err := phase(strings.TrimSpace(line))
		if err != nil {
			return err
		}
		fmt.Fprintln(os.Stdout, "done", said)
	}
}

// ProcessNode starts process p's node: node p+1, joining the MetaServer
// metaText names, or embedding it when metaText is empty (the
// coordinator, process 0, passes its MetaInfo to the workers).
func ProcessNode(ctx context.Context, p int, metaText string) (*Node, error) {
	var metas []meta.Info
	if metaText != "" {
		info, err := meta.ParseInfo(metaText)
		if err != nil {
			return nil, fmt.Errorf("-meta: %w", err)
		}
		metas = []meta.Info{info}
	}
	return StartNode(ctx, krcore.NodeID(p+1), metas)
}

// Alternate runs each of impls rounds times, reversing their order from
// one round to the next so that no implementation always runs first on a
// shared machine, and returns each one's results in the order they ran.
func Alternate[T any](impls []string, rounds int, run func(impl string, round int) (T, error)) (map[string][]T, error) {
	all := map[string][]T{}
	for k := range rounds {
		order := slices.Clone(impls)
		if k%2 == 1 {
			slices.Reverse(order)
		}
		for _, impl := range order {
			r, err := run(impl, k+1)
			if err != nil {
				return nil, fmt.Errorf("%s, round %d: %w", impl, k+1, err)
			}
			all[impl] = append(all[impl], r)
		}
	}
	return all, nil
}

// ServeRPC serves every connection ln accepts with srv, until ln is
// closed: the net/rpc side of the apps' comparisons. (rpc.Server.Accept
// would do, but logs the close as an error.)
func ServeRPC(srv *rpc.Server, ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go srv.ServeConn(c) // ends when the peer hangs up
	}
}

// Barriers is a barrier over Go net/rpc, the counterpart of lite's
// Barrier in the apps' net/rpc versions: its process registers it on its
// rpc.Server, and an Arrive returns once N calls named alike arrived.
type Barriers struct {
	mu      sync.Mutex
	waiting map[string]*generation
}

// generation is one barrier's arrivals so far.
type generation struct {
	arrived int
	done    chan struct{}
}

// Arrival is one Arrive's arguments.
type Arrival struct {
	Name string
	N    int
}

// Arrive waits until a.N calls with a.Name arrived. A participant that
// never arrives holds the others until their calls' contexts end.
func (b *Barriers) Arrive(a Arrival, _ *struct{}) error {
	b.mu.Lock()
	g := b.waiting[a.Name]
	if g == nil {
		g = &generation{done: make(chan struct{})}
		b.waiting[a.Name] = g
	}
	if g.arrived++; g.arrived == a.N {
		delete(b.waiting, a.Name)
		close(g.done)
	}
	b.mu.Unlock()
	<-g.done
	return nil
}

// NewBarriers is a Barriers with no one waiting.
func NewBarriers() *Barriers { return &Barriers{waiting: map[string]*generation{}} }

// Peers are a process's net/rpc connections to the app's processes in
// the apps' net/rpc versions: process p listens at Addrs[p] (set before
// the first Call) and is dialled on first use; the connection is kept
// until Close. The zero Peers is ready for use.
type Peers struct {
	Addrs []string

	mu      sync.Mutex
	clients map[int]*rpc.Client
}

// Call calls method at process p and waits for its reply or for ctx to
// end.
func (ps *Peers) Call(ctx context.Context, p int, method string, args, reply any) error {
	c, err := ps.client(p)
	if err != nil {
		return err
	}
	select {
	case call := <-c.Go(method, args, reply, nil).Done:
		return call.Error
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Arrive arrives at the barrier name of n participants that process 0
// serves (a Barriers) and returns once all n arrived.
func (ps *Peers) Arrive(ctx context.Context, name string, n int) error {
	return ps.Call(ctx, 0, "Barriers.Arrive", Arrival{Name: name, N: n}, &struct{}{})
}

// client is the connection to process p, dialled on first use.
func (ps *Peers) client(p int) (*rpc.Client, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if c := ps.clients[p]; c != nil {
		return c, nil
	}
	c, err := rpc.Dial("tcp", ps.Addrs[p])
	if err != nil {
		return nil, err
	}
	if ps.clients == nil {
		ps.clients = map[int]*rpc.Client{}
	}
	ps.clients[p] = c
	return c, nil
}

// Close closes every connection.
func (ps *Peers) Close() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, c := range ps.clients {
		c.Close()
	}
}

// RunWorker runs worker, and exits with its outcome, when this process is
// a worker (Worker); otherwise it returns. An app's main and its tests'
// TestMain call it first, so that Start can start the app's own
// executable (or test binary) as its workers.
func RunWorker(app string, worker func(i int, args []string) error) {
	i, ok := Worker()
	if !ok {
		return
	}
	if err := worker(i, os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "%s worker %d: %v\n", app, i, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Impls is what an app's -impl flag names: "lite", "rpc" or "both" (nil
// for anything else).
func Impls(flag string) []string {
	return map[string][]string{"both": {"lite", "rpc"}, "lite": {"lite"}, "rpc": {"rpc"}}[flag]
}

// Median is the run of median time among runs (sorted by it in place).
func Median[T any](runs []T, took func(T) time.Duration) T {
	slices.SortFunc(runs, func(a, b T) int { return cmp.Compare(took(a), took(b)) })
	return runs[len(runs)/2]
}

// Slowest is the longest of the durations workers said (time.Duration
// text; what does not parse counts as 0).
func Slowest(said []string) time.Duration {
	var m time.Duration
	for _, s := range said {
		d, _ := time.ParseDuration(s)
		m = max(m, d)
	}
	return m
}

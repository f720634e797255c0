package bench

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	krclient "github.com/krcore/krcore/client"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/internal/bench/flags"
	"github.com/krcore/krcore/internal/bench/vqrun"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/verbs"
)

// runDaemonServer is the server node's process: a soft node with its
// runtime (and, without -meta, the cluster's MetaServer), exporting the
// region and echoing messages until it is told to stop. It prints the
// MetaServer's text on stdout once it serves.
func runDaemonServer(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet(childServer, flag.ContinueOnError)
	metaText := fs.String("meta", "", "MetaServer to join (empty: embed one)")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", flags.ErrUsage, err)
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	b := &dBench{d: &dConfig{timeout: time.Minute}, ctx: ctx, log: slog.New(slog.DiscardHandler)}
	defer func() {
		for _, d := range b.devs {
			d.Close()
		}
	}()
	var metas []meta.Info
	if *metaText != "" {
		info, err := meta.ParseInfo(*metaText)
		if err != nil {
			return fmt.Errorf("-meta: %w", err)
		}
		metas = []meta.Info{info}
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	rt, err := b.node(sctx, dNodeServer, metas)
	cancel()
	if err != nil {
		return err
	}
	defer rt.Close()
	table, err := rt.RegMR(4096, verbs.AccessAll)
	if err != nil {
		return err
	}
	if err := rt.Export(dRegion, table, 0, 4096, verbs.AccessRemoteRead|verbs.AccessRemoteWrite); err != nil {
		return err
	}
	// The server plays a remote application on a soft node, whose waiter
	// reads the wire itself (DeviceAttr.ProgressInWait): it waits in
	// PopMsgsWait without spinning first. A spin would only hold a core the
	// client's side needs: on 2 cores a 200 us spin made the 64 B SEND round
	// trip ~217 us embedded and ~475 us through the daemon, against ~72 and
	// ~98 us without it.
	echo, err := vqrun.NewEcho(core.Embed(rt), echoPort, vqrun.Poll{})
	if err != nil {
		return err
	}
	defer echo.Close()
	if metas == nil {
		metas = []meta.Info{rt.MetaInfo()}
	}
	fmt.Fprintln(stdout, metas[0].String())
	for ctx.Err() == nil {
		echo.Serve(ctx, math.MaxInt, time.Second) // ends at each idle second
	}
	return nil
}

// runCoreRTT is the child that measures crossCoreRTT: it prints the
// nanoseconds, or 0 when it cannot measure.
func runCoreRTT(stdout io.Writer) error {
	rtt, _ := crossCoreRTT(20000, 5)
	_, err := fmt.Fprintln(stdout, rtt.Nanoseconds())
	return err
}

// runConnector is a connector process: attach, connect a VQ (cold), say
// ready, wait for go, run n warm connects, say done.
func runConnector(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) != 3 {
		return fmt.Errorf("%w: %s SOCKET NODE N", flags.ErrUsage, childConnex)
	}
	node, err1 := strconv.ParseUint(args[1], 10, 64)
	n, err2 := strconv.Atoi(args[2])
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("%w: %w", flags.ErrUsage, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cl, err := krclient.Attach(ctx, krclient.Options{Socket: args[0]})
	if err != nil {
		return err
	}
	defer cl.Close()
	q, err := cl.Queue()
	if err != nil {
		return err
	}
	defer q.Close()
	if err := q.Connect(ctx, node, nil); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	for i := range n {
		if err := q.Connect(ctx, node, nil); err != nil {
			return fmt.Errorf("warm connect #%d: %w", i, err)
		}
	}
	fmt.Fprintln(stdout, "done")
	return nil
}

// runKrcoredChild is krcored's role of this binary: the flags krcored takes
// that krbench daemon passes (-socket, -node, -listen, -meta, -log-level,
// -spin, -share-quantum), and krcored's own constructor (daemon.Start).
func runKrcoredChild(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet(childKrcored, flag.ContinueOnError)
	sock := fs.String("socket", "", "socket")
	node := fs.Uint64("node", dNodeDaemon, "node id")
	listen := fs.String("listen", "127.0.0.1:0", "soft RNIC address")
	metaText := fs.String("meta", "", "MetaServer to join")
	fs.String("log-level", "warn", "ignored: warnings and errors are logged")
	spin := fs.Duration("spin", 0, "how long a client's pump polls before it sleeps")
	share := fs.Duration("share-quantum", 0, "how long a pump works beside an interactive client before it naps (0: the default)")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", flags.ErrUsage, err)
	}
	info, err := meta.ParseInfo(*metaText)
	if err != nil {
		return err
	}
	log := slogTo(stderr)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	n, err := daemon.Start(sctx, daemon.NodeConfig{Config: daemon.Config{Socket: *sock, Spin: *spin, ShareQuantum: *share, Logger: log},
		Node: *node, Meta: []meta.Info{info}, Device: daemon.DeviceConfig{Provider: daemon.ProviderSoft, Listen: *listen}})
	cancel()
	if err != nil {
		return err
	}
	defer n.Close()
	return n.Serve(ctx)
}

// runDaemonRole runs krbench daemon or one of its child roles when args
// name one; ok is false otherwise.
func runDaemonRole(ctx context.Context, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	if len(args) == 0 {
		return 0, false
	}
	var err error
	switch args[0] {
	case "daemon":
		return runDaemonCmd(ctx, args[1:], stdout, stderr), true
	case childKrcored:
		err = runKrcoredChild(ctx, args[1:], stderr)
	case childConnex:
		err = runConnector(ctx, args[1:], stdout)
	case childServer:
		err = runDaemonServer(ctx, args[1:], stdout)
	case childCoreRTT:
		err = runCoreRTT(stdout)
	default:
		return 0, false
	}
	return childStatus(stderr, args[0], err), true
}

package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// runLiteServer is krbench lite's master process: the master's LMR and
// the plain region beside it and echo servers (liteMaster) on a server
// node (serveNode); its line is the net/rpc echo's address.
func runLiteServer(ctx context.Context, stdout io.Writer) error {
	return serveNode(ctx, stdout, func(ctx context.Context, api krcore.API, dev verbs.Device) (string, func(), error) {
		release, rpcAddr, err := liteMaster(ctx, api, dev)
		return rpcAddr, release, err
	})
}

// serveNode is the body of a server child process: a soft node with the
// cluster's MetaServer, on which start sets up the child's services (ctx
// bounds the setup), until SIGTERM. It prints the MetaServer's text, then
// start's line, on stdout once they serve.
func serveNode(ctx context.Context, stdout io.Writer, start func(ctx context.Context, api krcore.API, dev verbs.Device) (line string, release func(), err error)) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	b := &dBench{d: &dConfig{timeout: time.Minute}, ctx: ctx, log: slog.New(slog.DiscardHandler)}
	defer func() {
		for _, d := range b.devs {
			d.Close()
		}
	}()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rt, err := b.node(sctx, dNodeServer, nil)
	if err != nil {
		return err
	}
	defer rt.Close()
	line, release, err := start(sctx, core.Embed(rt), b.devs[0])
	if err != nil {
		return err
	}
	defer release()
	fmt.Fprintln(stdout, rt.MetaInfo().String())
	fmt.Fprintln(stdout, line)
	<-ctx.Done()
	return nil
}

// runLiteRole runs krbench lite or its master process when args name one;
// ok is false otherwise.
func runLiteRole(ctx context.Context, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	if len(args) == 0 {
		return 0, false
	}
	var err error
	switch args[0] {
	case "lite":
		return runLiteCmd(ctx, args[1:], stdout, stderr), true
	case childLiteServer:
		err = runLiteServer(ctx, stdout)
	case childLiteLocker:
		err = runLiteLocker(ctx, args[1:], stdout)
	default:
		return 0, false
	}
	return childStatus(stderr, args[0], err), true
}

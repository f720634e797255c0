package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/krcore/krcore/core"
)

// runLiteServer is krbench lite's master process: a soft node with the
// cluster's MetaServer, the master's LMR and the plain region beside it
// and echo servers (liteMaster), until SIGTERM. It prints the
// MetaServer's text and the net/rpc echo's address on stdout once it
// serves.
func runLiteServer(ctx context.Context, stdout io.Writer) error {
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
	release, rpcAddr, err := liteMaster(sctx, core.Embed(rt), b.devs[0])
	if err != nil {
		return err
	}
	defer release()
	fmt.Fprintln(stdout, rt.MetaInfo().String())
	fmt.Fprintln(stdout, rpcAddr)
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
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(stderr, "krbench %s: %v\n", args[0], strings.TrimSpace(err.Error()))
		return 1, true
	}
	return 0, true
}

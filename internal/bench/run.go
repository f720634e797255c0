package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/krcore/krcore/internal/bench/pingpong"
	"github.com/krcore/krcore/internal/bench/report"
)

// Main is krbench (cmd/krbench) on the process's standard output and
// error, until SIGINT or SIGTERM: it returns the exit status.
func Main(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return run(ctx, args, os.Stdout, os.Stderr)
}

// run is Main without the process: it returns the exit status, so tests can
// call it and nothing in krbench calls os.Exit on an error path.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if code, ok := runDaemonRole(ctx, args, stdout, stderr); ok {
		return code
	}
	if code, ok := runLiteRole(ctx, args, stdout, stderr); ok {
		return code
	}
	if code, ok := runSMCRole(ctx, args, stdout, stderr); ok {
		return code
	}
	if len(args) > 0 && args[0] == "pingpong" {
		return pingpong.Run(ctx, args[1:], stdout, stderr)
	}
	cfg, err := parseArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "krbench: %v\n(run krbench -h for help)\n", err)
		return 2
	}
	stopProfiles, err := startProfiles(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "krbench: %v\n", err)
		return 1
	}
	defer stopProfiles()
	switch cfg.role {
	case roleServer:
		err = runServer(ctx, cfg, stdout, stderr)
	case roleClient:
		err = runClientCmd(ctx, cfg, stdout, stderr)
	case roleInproc:
		err = runInproc(ctx, cfg, stdout, stderr)
	case roleDemo:
		err = runDemo(ctx, cfg, stdout, stderr)
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, report.ErrTargetMissed):
		fmt.Fprintf(stderr, "krbench: %v\n", err)
		return 3
	case ctx.Err() != nil && cfg.role == roleServer:
		return 0 // SIGINT is how a server is meant to stop
	}
	fmt.Fprintf(stderr, "krbench: %v\n", err)
	return 1
}

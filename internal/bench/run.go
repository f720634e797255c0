package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
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

// cmdStatus is the exit status of a krbench subcommand (daemon, lite, smc)
// that ended with err, which it reports on stderr: 3 for a missed target
// (-check), 1 for any other error.
func cmdStatus(stderr io.Writer, cmd string, err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, report.ErrTargetMissed):
		fmt.Fprintf(stderr, "krbench %s: %v\n", cmd, err)
		return 3
	}
	fmt.Fprintf(stderr, "krbench %s: %v\n", cmd, err)
	return 1
}

// childStatus is the exit status of a child process's role that ended with
// err, which it reports on stderr as one trimmed line: 1, or 0 when err is
// nil or the child was stopped (its context canceled by SIGTERM).
func childStatus(stderr io.Writer, role string, err error) int {
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(stderr, "krbench %s: %v\n", role, strings.TrimSpace(err.Error()))
		return 1
	}
	return 0
}

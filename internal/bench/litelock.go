package bench

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/perf"
	"github.com/krcore/krcore/lite"
	"github.com/krcore/krcore/meta"
)

// The lock hand-off series: a lite Lock mastered by the master process,
// taken and released in a loop by this process and by a locker child
// process at once, so that under the FIFO ticket lock every acquisition
// is a hand-off from the other process; the figure is the time per
// hand-off (elapsed / acquisitions), beside one process taking it alone.
const (
	liteLockName    = "krbench-lock"
	childLiteLocker = "lite-locker"
	// The locker processes' node ids: one per round, since a node id is
	// one incarnation's (a new process under the id of one that just
	// exited is not reached while the cluster still knows the old one).
	dNodeLocker = 104
)

// lockHandoffs adds the lock figures: medians of 3 rounds.
func (b *liteBench) lockHandoffs(ctx context.Context, info meta.Info, s *liteSide) error {
	l, err := s.node.OpenLock(ctx, dNodeServer, liteLockName)
	if err != nil {
		return err
	}
	defer l.Close(ctx)
	per := max(b.c.n/4, 10)
	var handoff, alone []float64
	for round := range 3 {
		t0 := time.Now()
		if err := lockLoop(ctx, l, per); err != nil {
			return fmt.Errorf("lock alone: %w", err)
		}
		alone = append(alone, time.Since(t0).Seconds()*1e6/float64(per))
		d, err := b.contend(ctx, info, l, per, dNodeLocker+round)
		if err != nil {
			return fmt.Errorf("lock hand-off: %w", err)
		}
		handoff = append(handoff, d.Seconds()*1e6/float64(2*per))
	}
	b.out.AddFigures(
		perf.Figure("cross-process: lite lock hand-off between two processes, both contending (elapsed / acquisitions, median of 3 rounds)", median(handoff), " usec"),
		perf.Figure("cross-process: lite Lock+Unlock, one process alone (median of 3 rounds)", median(alone), " usec"))
	return nil
}

// lockLoop takes and releases l n times.
func lockLoop(ctx context.Context, l *lite.Lock, n int) error {
	for i := range n {
		if err := l.Lock(ctx); err != nil {
			return fmt.Errorf("#%d: %w", i, err)
		}
		if err := l.Unlock(ctx); err != nil {
			return fmt.Errorf("#%d: %w", i, err)
		}
	}
	return nil
}

// contend runs per Lock/Unlock pairs here and in a locker process at once
// and returns the time until both are done.
func (b *liteBench) contend(ctx context.Context, info meta.Info, l *lite.Lock, per, node int) (time.Duration, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	cmd := exec.CommandContext(ctx, exe, childLiteLocker, "-meta", info.String(), "-n", strconv.Itoa(per), "-node", strconv.Itoa(node))
	cmd.Stderr = b.stderr
	setChildAttrs(cmd)
	in, err1 := cmd.StdinPipe()
	out, err2 := cmd.StdoutPipe()
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer cmd.Wait()
	defer in.Close()
	r := bufio.NewReader(out)
	if line, err := r.ReadString('\n'); err != nil || line != "ready\n" {
		return 0, fmt.Errorf("locker process: %q %v", line, err)
	}
	t0 := time.Now()
	io.WriteString(in, "go\n")
	errc := make(chan error, 1)
	go func() { errc <- lockLoop(ctx, l, per) }()
	line, err := r.ReadString('\n')
	if err == nil && line != "done\n" {
		err = fmt.Errorf("locker process said %q", line)
	}
	err = errors.Join(err, <-errc)
	return time.Since(t0), err
}

// runLiteLocker is the locker process: its own node (-node) joining
// -meta, the master's lock opened; on "go" it takes and releases the lock
// -n times and says done.
func runLiteLocker(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet(childLiteLocker, flag.ContinueOnError)
	metaText := fs.String("meta", "", "the MetaServer")
	n := fs.Int("n", 0, "Lock/Unlock pairs")
	id := fs.Uint64("node", dNodeLocker, "this process's node id")
	if err := fs.Parse(args); err != nil {
		return err
	}
	info, err := meta.ParseInfo(*metaText)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	b := &dBench{d: &dConfig{timeout: time.Minute}, ctx: ctx, log: slog.New(slog.DiscardHandler)}
	defer func() {
		for _, d := range b.devs {
			d.Close()
		}
	}()
	rt, err := b.node(ctx, krcore.NodeID(*id), []meta.Info{info})
	if err != nil {
		return err
	}
	defer rt.Close()
	node, err := lite.Open(ctx, core.Embed(rt), lite.Options{})
	if err != nil {
		return err
	}
	defer node.Close()
	l, err := node.OpenLock(ctx, dNodeServer, liteLockName)
	if err != nil {
		return err
	}
	defer l.Close(ctx)
	fmt.Fprintln(stdout, "ready")
	in := bufio.NewReader(os.Stdin)
	if _, err := in.ReadString('\n'); err != nil {
		return err
	}
	if err := lockLoop(ctx, l, *n); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "done")
	return nil
}

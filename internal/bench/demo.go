package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/krcore/krcore/internal/bench/report"
)

// startTimeout bounds how long the demo waits for its server child to say
// where it listens: a fresh `go run` has compiled already by then.
const startTimeout = 20 * time.Second

// runDemo is `krbench demo`: start the server side as a child process (this
// same binary with -server on an ephemeral port), run the suite against it
// across processes, on the shared-memory link and then (the raw verbs
// tests) on the forced TCP link, then run it again in one process on the
// in-memory fabric, and print the ratios. One command on a fresh machine
// shows every figure the project tracks.
func runDemo(ctx context.Context, cfg *config, stdout, stderr io.Writer) error {
	out := newOutput(cfg, stdout)
	// The runtime's walkthrough comes first: it is the demo's headline.
	if slices.Contains(cfg.tests, testCluster) {
		logf := func(string, ...any) {}
		if cfg.verbose {
			logf = func(format string, a ...any) { fmt.Fprintf(stderr, "krbench: "+format+"\n", a...) }
		}
		if err := runCluster(ctx, cfg, out, stderr, logf); err != nil {
			return err
		}
	}
	// Across processes: everything that talks to the server (the
	// cluster and mesh tests run in this process only, once), on the
	// link two processes of one host use; then the soft fabric's raw
	// tests on the TCP link, as between hosts, beside it.
	xcfg := *cfg
	xcfg.tests = slices.DeleteFunc(slices.Clone(cfg.tests), isLocal)
	xcfg.link = linkShm
	if err := runCross(ctx, &xcfg, out, stdout, stderr); err != nil {
		return err
	}
	tcfg := xcfg
	tcfg.link = linkTCP
	tcfg.tests = slices.DeleteFunc(slices.Clone(xcfg.tests), func(t string) bool { return !slices.Contains(tcpLinkTests, t) })
	if len(tcfg.tests) > 0 {
		if err := runCross(ctx, &tcfg, out, stdout, stderr); err != nil {
			return err
		}
	}

	// In one process the TCP baseline compares the in-memory wire with a
	// loopback socket, which answers no question; the in-process target is
	// absolute (READ under 1 usec).
	icfg := *cfg
	icfg.baseline = false
	icfg.tests = slices.DeleteFunc(slices.Clone(cfg.tests), func(t string) bool { return t == testRaw || t == testCluster })
	if len(icfg.tests) > 0 {
		if err := runInprocSuite(ctx, &icfg, out, stderr); err != nil {
			return fmt.Errorf("demo in-process: %w", err)
		}
	}
	return out.Finish(cfg.check)
}

// tcpLinkTests are what the demo runs on the forced TCP link: the soft
// fabric's own figures against the TCP baseline.
var tcpLinkTests = []string{testRaw, testRead, testWrite, testSend, testPairRead, testPairWrite}

// runCross starts a server child on cfg.link and runs cfg.tests against it.
func runCross(ctx context.Context, cfg *config, out *report.Output, stdout, stderr io.Writer) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("demo: find own executable to start the server: %w", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	args := []string{"-server", "-port", "0", "-once", "-bind", "127.0.0.1", "-link", cfg.link,
		"-fabric-addr", cfg.fabricAddr, "-timeout", cfg.timeout.String(), "-idle", cfg.idle.String()}
	if cfg.spin >= 0 {
		args = append(args, "-spin", cfg.spin.String())
	}
	cmd := exec.CommandContext(cctx, exe, args...)
	// Ask politely first (the server exits cleanly on SIGINT), then kill.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 5 * time.Second
	setChildAttrs(cmd)
	addrCh := make(chan string, 1)
	cmd.Stdout = &listenWatcher{found: addrCh, rest: stderr}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("demo: start server child: %w", err)
	}
	waitCh := make(chan error, 1)
	go func() { waitCh <- cmd.Wait() }()

	var addr string
	select {
	case addr = <-addrCh:
	case err := <-waitCh:
		return fmt.Errorf("demo: server child exited before listening: %v", err)
	case <-time.After(startTimeout):
		cancel()
		<-waitCh
		return fmt.Errorf("demo: server child did not start listening within %v", startTimeout)
	case <-ctx.Done():
		<-waitCh
		return ctx.Err()
	}
	if !cfg.json {
		fmt.Fprintf(stdout, "krbench demo: server child pid %d on %s, %s link: cross-process run\n", cmd.Process.Pid, addr, cfg.link)
	}
	runErr := runSuite(ctx, cfg, addr, newTCPFabric(cfg), out, stderr)
	if runErr != nil {
		cancel() // the child may be stuck waiting for us
	}
	// The child serves one client (-once) and exits after our bye.
	select {
	case err := <-waitCh:
		if err != nil && runErr == nil {
			runErr = fmt.Errorf("demo: server child: %w", err)
		}
	case <-time.After(cfg.timeout):
		cancel()
		<-waitCh
		if runErr == nil {
			runErr = errors.New("demo: server child did not exit after the run")
		}
	}
	return runErr
}

// listenWatcher is the child's stdout: it picks the listen address out of
// the server's first line and passes everything after to rest.
type listenWatcher struct {
	mu    sync.Mutex
	buf   []byte
	found chan string
	done  bool
	rest  io.Writer
}

func (w *listenWatcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return w.rest.Write(p)
	}
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(w.buf[:i])
		w.buf = w.buf[i+1:]
		if addr, ok := strings.CutPrefix(line, listenPrefix); ok {
			w.done = true
			w.found <- strings.TrimSpace(addr)
			if len(w.buf) > 0 {
				w.rest.Write(w.buf)
			}
			w.buf = nil
			return len(p), nil
		}
		fmt.Fprintln(w.rest, line)
	}
}

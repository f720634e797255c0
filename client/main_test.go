package client_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/verbs"
)

// childEnv makes a re-executed test binary a client process: its value is
// the daemon's socket; it reads node 2's region until killed.
const childEnv = "KRCORE_CLIENT_CHILD"

func TestMain(m *testing.M) {
	if sock := os.Getenv(childEnv); sock != "" {
		switch os.Getenv(modeEnv) {
		case "reads":
			os.Exit(runReader(sock))
		case "flood":
			os.Exit(runFlooder(sock))
		case "victim":
			os.Exit(runVictim(sock))
		case "node":
			os.Exit(runNode())
		case "checker":
			os.Exit(runChecker(sock))
		case "churner":
			os.Exit(runChurner(sock))
		case "churnvictim":
			os.Exit(runChurnVictim(sock))
		}
		os.Exit(runChild(sock))
	}
	os.Exit(m.Run())
}

// runChild is a client process that attaches, registers memory, makes two
// VQs and keeps READs in flight until it is killed.
func runChild(sock string) int {
	ctx := context.Background()
	c, err := client.Attach(ctx, client.Options{Socket: sock})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	buf, err := c.RegMR(4096, verbs.AccessAll)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	var qs []krcore.VQ
	var g krcore.Region
	for range 2 {
		q, err := c.Queue()
		if err == nil {
			err = q.Connect(ctx, 2, nil)
		}
		if err == nil {
			g, err = q.Region(ctx, "table")
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 1
		}
		qs = append(qs, q)
	}
	fmt.Println("ready")
	out := make([]krcore.Completion, 16)
	for i := uint64(0); ; i++ {
		q := qs[i%2]
		if _, err := q.Push(ctx, true, krcore.Request{ID: i, Op: verbs.OpRead, Local: buf.Range(0, 64), Remote: g.At(0)}); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 1
		}
		if q.Outstanding() > 8 {
			q.PopWait(ctx, out)
		}
	}
}

// quiet drops the daemon's logs in tests.
var quiet = slog.New(slog.DiscardHandler)

// env is a daemon serving node 1 of a two-node in-process cluster; node 2
// exports "table" (4 KiB, read/write/atomic).
type env struct {
	c     *cluster.Cluster
	srv   *daemon.Server
	sock  string
	table krcore.MR
	done  chan error
}

// startEnv starts a two-node cluster, node 2 exporting "table", and a
// daemon on node 1; rt, if given, is the template of the nodes' runtimes.
func startEnv(t testing.TB, rt ...core.Config) *env {
	t.Helper()
	cfg := cluster.Config{Nodes: 2}
	if len(rt) > 0 {
		cfg.Runtime = rt[0]
	}
	return startCluster(t, cfg)
}

// startCluster is startEnv with the whole cluster configuration.
func startCluster(t testing.TB, cfg cluster.Config) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{c: c, sock: filepath.Join(t.TempDir(), "krcored.sock")}
	e.table, _ = c.Node(2).RegMR(4096, verbs.AccessAll)
	copy(e.table.Bytes(), "hello from node 2")
	if err := c.Node(2).Export("table", e.table, 0, 4096, verbs.AccessRemoteRead|verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic); err != nil {
		t.Fatal(err)
	}
	e.start(t)
	t.Cleanup(func() {
		e.stop()
		c.Close()
	})
	return e
}

func (e *env) start(t testing.TB) { e.startWith(t, daemon.Config{}) }

// startWith starts the env's daemon with cfg (its socket and logger set).
func (e *env) startWith(t testing.TB, cfg daemon.Config) {
	t.Helper()
	cfg.Socket, cfg.Logger = e.sock, quiet
	srv, err := daemon.New(e.c.Node(1), cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.srv, e.done = srv, make(chan error, 1)
	go func() { e.done <- srv.Serve(context.Background()) }()
}

func (e *env) stop() {
	if e.srv != nil {
		e.srv.Close()
		<-e.done
		e.srv = nil
	}
}

func attach(t testing.TB, e *env) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Attach(ctx, client.Options{Socket: e.sock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// startTalker runs a client process that takes requests on its stdin and
// answers a line each on its stdout (runVictim).
func startTalker(t *testing.T, sock string, env ...string) (*exec.Cmd, io.Writer, *bufio.Scanner) {
	t.Helper()
	cmd, out := launch(t, sock, env)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	start(t, cmd)
	lines := bufio.NewScanner(out)
	lines.Buffer(nil, 1<<20)
	if !lines.Scan() || lines.Text() != "ready" {
		t.Fatalf("child did not start: %q %v", lines.Text(), lines.Err())
	}
	return cmd, in, lines
}

// startChild runs a client process; it is killed and reaped at cleanup.
// env adds variables (modeEnv ...).
func startChild(t *testing.T, sock string, env ...string) *exec.Cmd {
	t.Helper()
	cmd, out := launch(t, sock, env)
	start(t, cmd)
	line := make([]byte, 6)
	if _, err := io.ReadFull(out, line); err != nil || string(line) != "ready\n" {
		// Its stderr is whole, and no longer written, once it is reaped.
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child did not start: %q %v; stderr: %s", line, err, cmd.Stderr)
	}
	return cmd
}

// killMidTraffic SIGKILLs the client process child (named what in a
// timeout) once the daemon has taken more than 20 of its pushes, and
// reaps it: a client that dies with requests in flight.
func killMidTraffic(t *testing.T, e *env, child *exec.Cmd, what string) {
	t.Helper()
	waitFor(t, what+" traffic", func() bool {
		for _, cs := range e.srv.Status().Clients {
			if int(cs.PID) == child.Process.Pid && cs.Pushes > 20 {
				return true
			}
		}
		return false
	})
	child.Process.Signal(syscall.SIGKILL)
	child.Wait()
}

// launch prepares a client process (this test binary, see TestMain) and
// its stdout.
func launch(t *testing.T, sock string, env []string) (*exec.Cmd, io.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	cmd.Env = append(append(os.Environ(), childEnv+"="+sock, "GORACE="+gorace), env...)
	cmd.Stderr = new(strings.Builder)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	return cmd, out
}

// start starts cmd; it is killed and reaped at cleanup.
func start(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("child stderr: %s", cmd.Stderr)
		}
	})
}

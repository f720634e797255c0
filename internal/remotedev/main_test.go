package remotedev_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/remotedev"
	"github.com/krcore/krcore/verbs"
)

// childModeEnv makes a re-executed test binary serve a device instead of
// running tests; its value picks the device from childServers.
const childModeEnv = "KRCORE_REMOTE_CHILD"

// childServers build what a child serves. Each returns the server and a
// function that releases the device once serving is over.
var childServers = map[string]func() (*remotedev.Server, func(), error){
	"fake": func() (*remotedev.Server, func(), error) {
		d := newFakeDev()
		return &remotedev.Server{Device: d}, func() { d.Close() }, nil
	},
}

func TestMain(m *testing.M) {
	if mode := os.Getenv(childModeEnv); mode != "" {
		os.Exit(runChild(mode))
	}
	os.Exit(m.Run())
}

// runChild serves one device on the connection StartChild passed us, until
// the parent closes it, hangs up or signals us.
func runChild(mode string) int {
	build := childServers[mode]
	if build == nil {
		fmt.Fprintf(os.Stderr, "remote child: unknown mode %q\n", mode)
		return 2
	}
	conn, err := remotedev.ChildConn()
	if err != nil {
		fmt.Fprintln(os.Stderr, "remote child:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	srv, release, err := build()
	if err != nil {
		fmt.Fprintln(os.Stderr, "remote child:", err)
		conn.Close()
		return 1
	}
	err = srv.Serve(ctx, conn)
	release()
	if err != nil {
		fmt.Fprintln(os.Stderr, "remote child:", err)
		return 1
	}
	return 0
}

// startChild re-executes the test binary as a server of the device named
// mode. The child is stopped, or killed, and always reaped by t.Cleanup;
// its stderr is logged if the test failed.
func startChild(t testing.TB, mode string, opt remotedev.Options) *remotedev.Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// A -race binary sleeps a second at exit (atexit_sleep_ms) so late
	// reports get out; the child has no such stragglers to wait for.
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	cmd.Env = append(os.Environ(), childModeEnv+"="+mode, "GORACE="+gorace)
	stderr := new(lockedBuffer)
	cmd.Stderr = stderr
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch, err := remotedev.StartChild(ctx, cmd, opt)
	if err != nil {
		t.Fatalf("start %s child: %v\n%s", mode, err, stderr)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		// The device is usually closed already (ErrClosed); a child that
		// exits badly (a race report exits 66) or hangs is a failure.
		if err := ch.Stop(ctx); err != nil && !errors.Is(err, verbs.ErrClosed) {
			t.Errorf("stop %s child %d: %v", mode, ch.PID(), err)
		}
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("%s child %d stderr:\n%s", mode, ch.PID(), stderr)
		}
	})
	return ch
}

// lockedBuffer is a bytes.Buffer safe for exec's copying goroutine and a
// reader.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Len()
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

package bench

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"
)

// asMainEnv makes the test binary behave as krbench itself, so the
// cross-process test (and the demo's server child) can re-exec it instead
// of building a binary.
const asMainEnv = "KRBENCH_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		os.Exit(Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// syncBuffer is a bytes.Buffer safe for a server goroutine to write while
// the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// runKrbench runs krbench in this process and returns exit status, stdout
// and stderr.
func runKrbench(t *testing.T, ctx context.Context, args ...string) (int, string, string) {
	t.Helper()
	var out, errb syncBuffer
	code := run(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

// krbenchProcess runs this test binary as krbench with args, in a process
// of its own (it may start children, which re-execute it), and returns
// its stdout; it fails t unless krbench exits 0 within 2 minutes.
func krbenchProcess(t *testing.T, args ...string) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("krbench %s: %v\nstderr: %s\nstdout: %s", args[0], err, stderr.String(), stdout.String())
	}
	return stdout.String()
}

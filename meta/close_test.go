package meta

import (
	"errors"
	"testing"
	"time"
)

// TestCloseWakesCalls: Close fails the calls in flight (a Register whose
// server no longer answers, retrying for seconds) with ErrClosed at once,
// and every later call.
func TestCloseWakesCalls(t *testing.T) {
	nodes := memNodes(t, 2)
	srv := startServer(t, nodes[0], ServerConfig{})
	info := srv.Info()
	c, err := NewClient(nodes[1], []Info{info}, ClientConfig{RequestTimeout: 500 * time.Millisecond, Attempts: 20})
	if err != nil {
		t.Fatal(err)
	}
	srv.Close() // the server's UD QP is gone: requests to it go unanswered
	res := make(chan error, 1)
	go func() { res <- c.Register(testCtx(t), recordOf(nodes[1], 1), 0) }()
	time.Sleep(20 * time.Millisecond) // let the Register send its first attempt; sent or not, Close must end it
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-res:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("Register in flight at Close: %v, want ErrClosed", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Register still in flight 2s after Close")
	}
	select {
	case <-closed:
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not return")
	}
	if _, err := c.Lookup(testCtx(t), 1); !errors.Is(err, ErrClosed) {
		t.Errorf("Lookup after Close: %v, want ErrClosed", err)
	}
}

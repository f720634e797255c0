package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore/client"
)

// TestRun starts krcored from a config file plus flags, attaches a client,
// scrapes the metrics and stops it as SIGTERM would (its context ends): the
// client then finds the daemon gone.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "krcored.sock")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metrics := ln.Addr().String()
	ln.Close()
	conf := filepath.Join(dir, "krcored.json")
	os.WriteFile(conf, []byte(`{"socket": "/nonexistent/overridden.sock", "node": 7, "max_vqs": 4, "log_level": "warn"}`), 0o600)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-config", conf, "-socket", sock, "-metrics", metrics}) }()
	defer func() { cancel(); <-done }()

	var c *client.Client
	deadline := time.Now().Add(10 * time.Second)
	for c == nil {
		actx, acancel := context.WithTimeout(ctx, time.Second)
		c, err = client.Attach(actx, client.Options{Socket: sock})
		acancel()
		if err != nil && time.Now().After(deadline) {
			t.Fatal(err)
		}
		if err != nil {
			time.Sleep(10 * time.Millisecond) // the daemon is starting
		}
	}
	defer c.Close()
	if c.Node() != 7 {
		t.Errorf("node %d, want 7 from the config file", c.Node())
	}
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode %v %v, want 0660", fi.Mode(), err)
	}
	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "krcored_clients 1") {
		t.Errorf("metrics:\n%s", body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
	done <- nil
	if _, err := c.Queue(); !errors.Is(err, client.ErrDaemonGone) {
		t.Errorf("after shutdown: %v, want ErrDaemonGone", err)
	}
}

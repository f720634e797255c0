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
	"github.com/krcore/krcore/provider/ibverbs"
	"github.com/krcore/krcore/verbs"
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

// TestProviderConfig reads the ibverbs keys from a config file, with a flag
// overriding one of them.
func TestProviderConfig(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "krcored.json")
	os.WriteFile(conf, []byte(`{"provider": "ibverbs", "ib_dev": "rxe0", "ib_port": 2, "gid_idx": 3, "node": 9}`), 0o600)
	cfg, err := load([]string{"-config", conf, "-gid-idx", "1"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Provider != providerIBVerbs || cfg.IBDev != "rxe0" || cfg.IBPort != 2 || cfg.GIDIdx != 1 || cfg.Node != 9 {
		t.Errorf("config %+v: want ibverbs rxe0 port 2 GID 1 (the flag's) node 9", cfg)
	}
	cfg, err = load([]string{"-provider", "ibverbs", "-ib-dev", "mlx5_0", "-ib-port", "1"})
	if err != nil || cfg.IBDev != "mlx5_0" || cfg.IBPort != 1 || cfg.GIDIdx != -1 {
		t.Errorf("flags: %+v %v: want mlx5_0 port 1, GID -1 (the provider's choice)", cfg, err)
	}
}

// TestProviderUsage refuses what does not fit the provider, and an
// ibverbs daemon in a build without the rdma tag, before it binds anything.
func TestProviderUsage(t *testing.T) {
	for _, args := range [][]string{
		{"-provider", "tcp"},
		{"-ib-dev", "rxe0"},
		{"-gid-idx", "1"},
		{"-meta", "addr=127.0.0.1:1 qpn=5 qkey=1"},
		{"-provider", "ibverbs", "-listen", "127.0.0.1:0"},
		{"-provider", "ibverbs", "-ib-port", "0"},
		{"-provider", "ibverbs", "-gid-idx", "-2"},
	} {
		if _, err := parse(args); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	if ibverbs.Built {
		t.Skip("built with -tags rdma: no stub error to check")
	}
	sock := filepath.Join(t.TempDir(), "krcored.sock")
	err := run(context.Background(), []string{"-provider", "ibverbs", "-ib-dev", "rxe0", "-socket", sock})
	if !errors.Is(err, verbs.ErrUnsupported) || !strings.Contains(err.Error(), "built without rdma support") {
		t.Errorf("run -provider ibverbs: %v, want the provider's \"built without rdma support\"", err)
	}
	if _, err := os.Stat(sock); err == nil {
		t.Errorf("the socket %s was made", sock)
	}
}

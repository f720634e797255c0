package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/verbs"
)

// TestKrctl runs status and every list, as tables and as JSON, against a
// daemon with one client holding a VQ and an MR.
func TestKrctl(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sock := filepath.Join(t.TempDir(), "krcored.sock")
	srv, err := daemon.New(c.Node(1), daemon.Config{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	defer func() { srv.Close(); <-done }()

	cl, err := client.Attach(ctx, client.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	q, _ := cl.Queue()
	if err := q.Connect(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.RegMR(4096, verbs.AccessAll); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	if err := run(ctx, []string{"-socket", sock, "-json", "status"}, &out); err != nil {
		t.Fatal(err)
	}
	var st daemon.Status
	if err := json.Unmarshal(out.Bytes(), &st); err != nil {
		t.Fatal(err)
	}
	var mine *daemon.ClientStatus
	for i := range st.Clients {
		if st.Clients[i].ID == cl.ID() {
			mine = &st.Clients[i]
		}
	}
	if st.Node != 1 || mine == nil || len(mine.VQs) != 1 || mine.VQs[0].Node != 2 || mine.MRs != 1 || mine.MRBytes != 4096 {
		t.Fatalf("status: %s", out.String())
	}
	for _, what := range []string{"clients", "vqs", "qps", "meta", "counters"} {
		out.Reset()
		if err := run(ctx, []string{"-socket", sock, "list", what}, &out); err != nil {
			t.Fatal(what, err)
		}
		if out.Len() == 0 {
			t.Errorf("list %s printed nothing", what)
		}
		t.Logf("krctl list %s\n%s", what, out.String())
		out.Reset()
		if err := run(ctx, []string{"-socket", sock, "-json", "list", what}, &out); err != nil || !json.Valid(out.Bytes()) {
			t.Errorf("list %s -json: %v %q", what, err, out.String())
		}
	}
	out.Reset()
	run(ctx, []string{"-socket", sock, "list", "vqs"}, &out)
	if !strings.Contains(out.String(), "OUTSTANDING") || strings.Count(out.String(), "\n") != 2 {
		t.Errorf("list vqs:\n%s", out.String())
	}
	if err := run(ctx, []string{"-socket", sock, "bogus"}, &out); err != errUsage {
		t.Errorf("bogus command: %v", err)
	}
}

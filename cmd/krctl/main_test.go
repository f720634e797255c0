package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/verbs"
)

// startDaemon starts a two-node cluster, krcored on node 1 and a client
// of it, all stopped by t.Cleanup.
func startDaemon(t *testing.T, ctx context.Context) (*cluster.Cluster, *daemon.Server, string, *client.Client) {
	t.Helper()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	sock := filepath.Join(t.TempDir(), "krcored.sock")
	srv, err := daemon.New(c.Node(1), daemon.Config{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(context.Background()) }()
	t.Cleanup(func() { srv.Close(); <-done })
	cl, err := client.Attach(ctx, client.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return c, srv, sock, cl
}

// TestKrctl runs status and every list, as tables and as JSON, against a
// daemon with one client holding a VQ that READ node 2 and an MR: list qps
// shows a row per shared QP, the VQ on one of them, and list meta node 2's
// cached record.
func TestKrctl(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, srv, sock, cl := startDaemon(t, ctx)
	exp, _ := c.Node(2).RegMR(4096, verbs.AccessAll)
	if err := c.Node(2).Export("t", exp, 0, 4096, verbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	q, _ := cl.Queue()
	if err := q.Connect(ctx, 2, nil); err != nil {
		t.Fatal(err)
	}
	mr, err := cl.RegMR(4096, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	g, err := q.Region(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Push(ctx, true, krcore.Request{ID: 1, Op: verbs.OpRead, Local: mr.Range(0, 8), Remote: g.At(0)}); err != nil {
		t.Fatal(err)
	}
	var wc [1]krcore.Completion
	if _, err := q.PopWait(ctx, wc[:]); err != nil || wc[0].Err() != nil {
		t.Fatal(err, wc[0].Err())
	}

	var out bytes.Buffer
	if err := run(ctx, []string{"-socket", sock, "-json", "status"}, &out); err != nil {
		t.Fatal(err)
	}
	var st wire.Status
	if err := json.Unmarshal(out.Bytes(), &st); err != nil {
		t.Fatal(err)
	}
	var mine *wire.ClientStatus
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

	// list qps: a row per QP the daemon lists, the client's VQ on one.
	qps := srv.Status().QPs
	out.Reset()
	if err := run(ctx, []string{"-socket", sock, "list", "qps"}, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(qps) < 3 || len(lines) != 1+len(qps) || strings.Join(strings.Fields(lines[0]), " ") != "TYPE QPN PEER RQPN STATE VQS INFLIGHT QUEUED POSTED" {
		t.Fatalf("list qps for %d QPs:\n%s", len(qps), out.String())
	}
	for i, p := range qps {
		f := strings.Fields(lines[1+i])
		if len(f) != 9 || f[0] != string(p.Type) || f[1] != strconv.FormatUint(uint64(p.QPN), 10) || f[4] != string(p.State) {
			t.Errorf("row %q for %+v", lines[1+i], p)
		}
	}
	out.Reset()
	if err := run(ctx, []string{"-socket", sock, "-json", "list", "qps"}, &out); err != nil {
		t.Fatal(err)
	}
	var rows []core.PoolQP
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatal(err)
	}
	types, vqs := map[core.QPType]int{}, 0
	for _, p := range rows {
		types[p.Type]++
		vqs += p.VQs
	}
	if types[core.QPTypeDCT] != 1 || types[core.QPTypeDCI] == 0 || vqs != 1 || len(rows) != len(qps) {
		t.Errorf("list qps -json: %s", out.String())
	}

	// list meta: the counters, then node 2's cached record.
	out.Reset()
	if err := run(ctx, []string{"-socket", sock, "list", "meta"}, &out); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, l := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(l); len(f) == 6 && f[0] == "2" && f[4] != "0" {
			found = true
		}
	}
	if !strings.Contains(out.String(), "HITS") || !strings.Contains(out.String(), "NODE") || !found {
		t.Errorf("list meta lacks node 2:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "METASERVER") || !strings.Contains(out.String(), "qpn=") || !strings.Contains(out.String(), "embedded") {
		t.Errorf("list meta lacks the MetaServer and its source:\n%s", out.String())
	}
	out.Reset()
	if err := run(ctx, []string{"-socket", sock, "-json", "list", "meta"}, &out); err != nil {
		t.Fatal(err)
	}
	var ml struct {
		Misses  uint64
		Servers []string          `json:"meta_servers"`
		Source  string            `json:"meta_source"`
		Entries []meta.CacheEntry `json:"entries"`
	}
	if err := json.Unmarshal(out.Bytes(), &ml); err != nil {
		t.Fatal(err)
	}
	if ml.Misses == 0 || len(ml.Servers) != 1 || ml.Source != "embedded" || !slices.ContainsFunc(ml.Entries, func(e meta.CacheEntry) bool { return e.Node == 2 && e.DCTNum != 0 && e.Version != 0 }) {
		t.Errorf("list meta -json: %s", out.String())
	}

	if err := run(ctx, []string{"-socket", sock, "bogus"}, &out); err != errUsage {
		t.Errorf("bogus command: %v", err)
	}
}

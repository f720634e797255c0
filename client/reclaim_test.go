package client_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// metaEnv gives a node process (modeEnv "node") the MetaServer to join.
const metaEnv = "KRCORE_META"

// bigSize is the length of a READ of the region "big" a node process
// exports, beside "table".
const bigSize = 64 << 10

// runNode is node 2 as a process of its own, on the soft RNIC over TCP:
// it exports "table" ("hello from node 2") and "big" (4 x bigSize), prints
// "ready" and serves until its stdin closes. Stopping it (SIGSTOP) holds
// every request to it in flight.
func runNode() int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "node:", err); return 1 }
	info, err := meta.ParseInfo(os.Getenv(metaEnv))
	if err != nil {
		return fail(err)
	}
	dev, err := soft.NewFabric().NewNode(soft.Config{Listen: "127.0.0.1:0", RetryTimeout: 30 * time.Second})
	if err != nil {
		return fail(err)
	}
	defer dev.Close()
	rt, err := core.New(ctx, core.Config{Device: dev, Node: 2, Meta: []meta.Info{info}, Lease: time.Minute})
	if err != nil {
		return fail(err)
	}
	defer rt.Close()
	table, err := rt.RegMR(4096, verbs.AccessAll)
	if err == nil {
		copy(table.Bytes(), "hello from node 2")
		err = rt.Export("table", table, 0, 4096, verbs.AccessRemoteRead)
	}
	big, err2 := rt.RegMR(4*bigSize, verbs.AccessAll)
	if err == nil && err2 == nil {
		err = rt.Export("big", big, 0, 4*bigSize, verbs.AccessRemoteRead)
	}
	if err = errors.Join(err, err2); err != nil {
		return fail(err)
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// tcpEnv is a daemon on node 1 (a soft RNIC over TCP, embedding the
// MetaServer) and node 2 as a process (runNode).
type tcpEnv struct {
	rt   *core.Runtime
	srv  *daemon.Server
	sock string
	node *os.Process
}

func startTCPEnv(t *testing.T) *tcpEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dev, err := soft.NewFabric().NewNode(soft.Config{Listen: "127.0.0.1:0", RetryTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	rt, err := core.New(ctx, core.Config{Device: dev, Node: 1, RCPeers: -1, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	e := &tcpEnv{rt: rt, sock: filepath.Join(t.TempDir(), "krcored.sock")}
	cmd, out := launch(t, "-", []string{modeEnv + "=node", metaEnv + "=" + rt.MetaInfo().String()})
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	start(t, cmd)
	t.Cleanup(func() { stdin.Close() })
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		t.Fatalf("node 2 did not start: %q; stderr: %s", line, cmd.Stderr)
	}
	e.node = cmd.Process
	e.srv, err = daemon.New(rt, daemon.Config{Socket: e.sock, Logger: quiet, CallTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.srv.Serve(context.Background()) }()
	t.Cleanup(func() { e.srv.Close(); <-done })
	return e
}

// TestReclaimDrains: a client that goes (its socket closes, as when it is
// killed) with READs in flight on the shared DCIs is reclaimed without
// touching them: the daemon deregisters and unmaps its MRs only once its
// requests have finished. Node 2 is stopped (SIGSTOP) while the client
// goes, so its READs are surely in flight; once node 2 runs again, no
// request has failed its local check on a shared QP (no recovery, no post
// error) and a client beside it on the same DCIs gets its READ's bytes.
func TestReclaimDrains(t *testing.T) {
	e := startTCPEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	attachTo := func() *env { return &env{sock: e.sock} }
	b := attach(t, attachTo())
	qb, gb := connect(t, ctx, b)
	bufB, _ := b.RegMR(64, verbs.AccessAll)
	run(t, ctx, qb, krcore.Request{Op: verbs.OpRead, Local: bufB.Range(0, 17), Remote: gb.At(0)})
	base := e.rt.Stats()

	for range 3 {
		a := attach(t, attachTo())
		mr, err := a.RegMR(4*bigSize, verbs.AccessAll)
		if err != nil {
			t.Fatal(err)
		}
		var qs []krcore.VQ
		var gs []krcore.Region
		for range 2 {
			q, _ := connect(t, ctx, a)
			g, err := q.Region(ctx, "big")
			if err != nil {
				t.Fatal(err)
			}
			qs, gs = append(qs, q), append(gs, g)
		}
		e.node.Signal(syscall.SIGSTOP)
		pushed := 0
		for j, q := range qs {
			reqs := make([]krcore.Request, 8)
			for i := range reqs {
				reqs[i] = krcore.Request{ID: uint64(i), Op: verbs.OpRead, Local: mr.Range(i%4*bigSize, bigSize), Remote: gs[j].At(uint64(i % 4 * bigSize))}
			}
			k, err := q.Push(ctx, false, reqs...)
			if err != nil && !errors.Is(err, krcore.ErrNoCredit) {
				t.Fatal(err)
			}
			pushed += k
		}
		waitFor(t, "A's requests in the runtime", func() bool {
			for _, cs := range e.srv.Status().Clients {
				if cs.ID == a.ID() {
					return cs.Pushes >= uint64(pushed)
				}
			}
			return false
		})
		// B's READ goes behind A's on the shared DCIs
		clear(bufB.Bytes()[:17])
		var wg sync.WaitGroup
		var errB error
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]krcore.Completion, 1)
			errB = runSync(ctx, qb, out, krcore.Request{ID: 1, Op: verbs.OpRead, Local: bufB.Range(0, 17), Remote: gb.At(0)})
		}()
		a.Close() // gone with its READs in flight
		// Give a reclaim that does not wait for them the time to finish.
		reclaimed := func() bool { return len(e.srv.Status().Clients) == 1 }
		for t0 := time.Now(); !reclaimed() && time.Since(t0) < time.Second; {
			time.Sleep(5 * time.Millisecond) // polling the daemon's state
		}
		e.node.Signal(syscall.SIGCONT)
		waitFor(t, "reclaim", reclaimed)
		wg.Wait()
		if errB != nil || string(bufB.Bytes()[:17]) != "hello from node 2" {
			t.Errorf("B beside a reclaim: %v, buffer %q", errB, bufB.Bytes()[:17])
		}
	}
	st := e.rt.Stats()
	if st.Recoveries != base.Recoveries || st.PostErrors != base.PostErrors {
		t.Errorf("reclaim broke shared QPs: recoveries %d -> %d, post errors %d -> %d",
			base.Recoveries, st.Recoveries, base.PostErrors, st.PostErrors)
	}
}

package client_test

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// sentinelBed holds the clusters the sentinel scenarios run on. Each runs
// a daemon on its node 1, whose runtime is also the embedded API, and its
// node 2 exports "table" (startCluster).
type sentinelBed struct {
	// main has 4 nodes: 3 is a second live peer, 4 the one ErrPeerDead's
	// scenario kills. Short transport timeouts make the death quick to
	// find.
	main *env
	// rcOnly runs its runtimes RC-only with room for one RC peer (RCPeers
	// 1), and a transport timeout long enough that a request to a dead node
	// stays in flight, its RC QP busy, for the whole of ErrNoQP's scenario.
	// Nothing waits for that timeout: the cluster's Close flushes it.
	rcOnly *env
	// fewMRs has devices that register few MRs, a count RegMR can reach.
	fewMRs *env
	// clients are the krcored clients of each cluster's daemon.
	clients map[*env]*client.Client
	// nodes counts the nodes newNode added.
	nodes int
}

// fewMRs is the MR limit of fewMRs' devices: room for what a runtime
// registers for itself and for the table, and a few more.
const fewMRs = 48

func startSentinelBed(t *testing.T) *sentinelBed {
	short := core.Config{Path: verbs.Path{Timeout: 50 * time.Millisecond, RetryCount: 3}, Logger: quiet}
	b := &sentinelBed{
		main: startCluster(t, cluster.Config{Nodes: 4, Runtime: short, Soft: soft.Config{RetryTimeout: 300 * time.Millisecond}}),
		rcOnly: startCluster(t, cluster.Config{Nodes: 3, Runtime: core.Config{RCOnly: true, RCPeers: 1, Logger: quiet},
			Soft: soft.Config{RetryTimeout: time.Minute}}),
		fewMRs: startCluster(t, cluster.Config{Nodes: 2, Runtime: core.Config{Logger: quiet},
			Soft: soft.Config{Attr: verbs.DeviceAttr{MaxMR: fewMRs}}}),
		clients: map[*env]*client.Client{},
	}
	for _, e := range []*env{b.main, b.rcOnly, b.fewMRs} {
		b.clients[e] = attach(t, e)
	}
	return b
}

// newNode adds a node to main, for an embedded API of its own; the
// cluster's Close stops it.
func (b *sentinelBed) newNode(t *testing.T, ctx context.Context) *core.Runtime {
	t.Helper()
	b.nodes++
	id := krcore.NodeID(100 + b.nodes)
	if err := b.main.c.Add(ctx, cluster.Config{Runtime: core.Config{Logger: quiet}}, id); err != nil {
		t.Fatal(err)
	}
	return b.main.c.Node(id)
}

// side is one implementation of krcore.API on a cluster's node 1.
type side struct {
	name string
	api  krcore.API
	e    *env
}

// queue makes a VQ of s, closed at the end of the test.
func (s *side) queue(t *testing.T) krcore.VQ {
	t.Helper()
	q, err := s.api.Queue()
	if err != nil {
		t.Fatalf("%s: queue: %v", s.name, err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

// reader makes a VQ of s connected to node 2, with an MR and the table's
// region, for READs.
func (s *side) reader(t *testing.T, ctx context.Context) (krcore.VQ, krcore.Request) {
	t.Helper()
	q := s.queue(t)
	if err := q.Connect(ctx, 2, nil); err != nil {
		t.Fatalf("%s: connect to node 2: %v", s.name, err)
	}
	g, err := q.Region(ctx, "table")
	if err != nil {
		t.Fatalf("%s: region: %v", s.name, err)
	}
	return q, krcore.Request{ID: 1, Op: verbs.OpRead, Local: s.mr(t, 64).Range(0, 8), Remote: g.At(0)}
}

// mr registers size bytes with s, deregistered at the end of the test.
func (s *side) mr(t *testing.T, size int) krcore.MR {
	t.Helper()
	m, err := s.api.RegMR(size, verbs.AccessAll)
	if err != nil {
		t.Fatalf("%s: RegMR: %v", s.name, err)
	}
	t.Cleanup(func() { s.api.Deregister(m) })
	return m
}

// sentinelCase provokes one sentinel through the API alone.
type sentinelCase struct {
	sentinel string // its name in the root package
	how      string
	// bed picks the cluster; nil is main.
	bed func(b *sentinelBed) *env
	// prepare, if set, runs once before provoke runs on either side.
	prepare func(t *testing.T, ctx context.Context, b *sentinelBed)
	// fresh gives provoke APIs of its own to close: a new node of main,
	// embedded, and a new client of main's daemon.
	fresh   bool
	provoke func(t *testing.T, ctx context.Context, s *side) error
}

// closedAPI gives ErrClosed scenarios after API.Close: f gets the API
// and, made before the Close, a VQ connected to node 2 with a READ of the
// table and an MR.
func closedAPI(f func(ctx context.Context, s *side, q krcore.VQ, req krcore.Request, m krcore.MR) error) func(t *testing.T, ctx context.Context, s *side) error {
	return func(t *testing.T, ctx context.Context, s *side) error {
		q, req := s.reader(t, ctx)
		m := s.mr(t, 64)
		if err := s.api.Close(); err != nil {
			t.Fatalf("%s: close: %v", s.name, err)
		}
		return f(ctx, s, q, req, m)
	}
}

// sentinels are the root package's sentinels by name; the guard checks it
// against errors.go.
var sentinels = map[string]error{
	"ErrClosed": krcore.ErrClosed, "ErrNotConnected": krcore.ErrNotConnected, "ErrNoCredit": krcore.ErrNoCredit,
	"ErrPortInUse": krcore.ErrPortInUse, "ErrNoRegion": krcore.ErrNoRegion, "ErrUnreachable": krcore.ErrUnreachable,
	"ErrRefused": krcore.ErrRefused, "ErrNoQP": krcore.ErrNoQP, "ErrPeerDead": krcore.ErrPeerDead,
	"ErrDaemonGone": krcore.ErrDaemonGone, "ErrInvalid": krcore.ErrInvalid, "ErrLimit": krcore.ErrLimit,
	"ErrBusy": krcore.ErrBusy, "ErrUnsupported": krcore.ErrUnsupported,
}

// notBoth are the sentinels no scenario can meet on both implementations,
// and why.
var notBoth = map[string]string{
	"ErrDaemonGone": "only a client of krcored has a daemon to lose (TestDaemonGoneOnlyClient)",
	"ErrUnsupported": "neither the runtime nor krcored returns it; a device can, for a verbs call it lacks " +
		"(ibverbs maps EOPNOTSUPP and ENOSYS to it, and Register passes the registration's error on), " +
		"which the soft RNIC never refuses one of the API's calls for",
}

var sentinelCases = []sentinelCase{
	{sentinel: "ErrClosed", how: "push on a closed VQ", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		q, req := s.reader(t, ctx)
		q.Close()
		_, err := q.Push(ctx, true, req)
		return err
	}},
	{sentinel: "ErrClosed", how: "close a VQ twice", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		q := s.queue(t)
		q.Close()
		return q.Close()
	}},
	{sentinel: "ErrClosed", how: "bind a closed VQ", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		q := s.queue(t)
		q.Close()
		return q.Bind(4711)
	}},
	{sentinel: "ErrClosed", how: "connect a closed VQ", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		q := s.queue(t)
		q.Close()
		return q.Connect(ctx, 2, nil)
	}},
	{sentinel: "ErrClosed", how: "post a receive on a closed VQ", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		q := s.queue(t)
		q.Close()
		return q.PushRecv(s.mr(t, 64).Range(0, 64))
	}},
	{sentinel: "ErrClosed", how: "PopWait on a closed VQ", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		q := s.queue(t)
		q.Close()
		_, err := q.PopWait(ctx, make([]krcore.Completion, 1))
		return err
	}},
	{sentinel: "ErrClosed", how: "deregister an MR twice", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		m := s.mr(t, 64)
		if err := s.api.Deregister(m); err != nil {
			t.Fatalf("%s: first deregister: %v", s.name, err)
		}
		return s.api.Deregister(m)
	}},
	{sentinel: "ErrClosed", how: "close the API twice", fresh: true, provoke: closedAPI(func(ctx context.Context, s *side, q krcore.VQ, req krcore.Request, m krcore.MR) error {
		return s.api.Close()
	})},
	{sentinel: "ErrClosed", how: "Queue after Close", fresh: true, provoke: closedAPI(func(ctx context.Context, s *side, q krcore.VQ, req krcore.Request, m krcore.MR) error {
		_, err := s.api.Queue()
		return err
	})},
	{sentinel: "ErrClosed", how: "RegMR after Close", fresh: true, provoke: closedAPI(func(ctx context.Context, s *side, q krcore.VQ, req krcore.Request, m krcore.MR) error {
		_, err := s.api.RegMR(64, verbs.AccessAll)
		return err
	})},
	{sentinel: "ErrClosed", how: "Region after Close", fresh: true, provoke: closedAPI(func(ctx context.Context, s *side, q krcore.VQ, req krcore.Request, m krcore.MR) error {
		_, err := s.api.Region(ctx, 2, "table")
		return err
	})},
	{sentinel: "ErrClosed", how: "Export after Close", fresh: true, provoke: closedAPI(func(ctx context.Context, s *side, q krcore.VQ, req krcore.Request, m krcore.MR) error {
		return s.api.Export("late", m, 0, 64, verbs.AccessRemoteRead)
	})},
	{sentinel: "ErrClosed", how: "Export of another runtime's MR after Close", fresh: true, provoke: closedAPI(func(ctx context.Context, s *side, q krcore.VQ, req krcore.Request, m krcore.MR) error {
		return s.api.Export("late", s.e.table, 0, 64, verbs.AccessRemoteRead)
	})},
	{sentinel: "ErrRefused", how: "Deregister of another runtime's MR after Close", fresh: true, provoke: closedAPI(func(ctx context.Context, s *side, q krcore.VQ, req krcore.Request, m krcore.MR) error {
		return s.api.Deregister(s.e.table)
	})},
	{sentinel: "ErrClosed", how: "Unexport after Close", fresh: true, provoke: closedAPI(func(ctx context.Context, s *side, q krcore.VQ, req krcore.Request, m krcore.MR) error {
		return s.api.Unexport("table")
	})},
	{sentinel: "ErrClosed", how: "Deregister after Close", fresh: true, provoke: closedAPI(func(ctx context.Context, s *side, q krcore.VQ, req krcore.Request, m krcore.MR) error {
		return s.api.Deregister(m)
	})},
	{sentinel: "ErrClosed", how: "push on a VQ after its API's Close", fresh: true, provoke: closedAPI(func(ctx context.Context, s *side, q krcore.VQ, req krcore.Request, m krcore.MR) error {
		_, err := q.Push(ctx, true, req)
		return err
	})},
	{sentinel: "ErrClosed", how: "PopWait on a VQ after its API's Close", fresh: true, provoke: closedAPI(func(ctx context.Context, s *side, q krcore.VQ, req krcore.Request, m krcore.MR) error {
		_, err := q.PopWait(ctx, make([]krcore.Completion, 1))
		return err
	})},
	{sentinel: "ErrClosed", how: "connect a VQ after its API's Close", fresh: true, provoke: closedAPI(func(ctx context.Context, s *side, q krcore.VQ, req krcore.Request, m krcore.MR) error {
		return q.Connect(ctx, 2, nil)
	})},
	{sentinel: "ErrClosed", how: "bind a VQ after its API's Close", fresh: true, provoke: closedAPI(func(ctx context.Context, s *side, q krcore.VQ, req krcore.Request, m krcore.MR) error {
		return q.Bind(4711)
	})},
	{sentinel: "ErrClosed", how: "post a receive on a VQ after its API's Close", fresh: true, provoke: closedAPI(func(ctx context.Context, s *side, q krcore.VQ, req krcore.Request, m krcore.MR) error {
		return q.PushRecv(m.Range(0, 64))
	})},
	{sentinel: "ErrNotConnected", how: "push before connect", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		_, err := s.queue(t).Push(ctx, true, krcore.Request{ID: 1, Op: verbs.OpRead, Local: s.mr(t, 64).Range(0, 8)})
		return err
	}},
	{sentinel: "ErrNotConnected", how: "VQ.Region before connect", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		_, err := s.queue(t).Region(ctx, "table")
		return err
	}},
	{sentinel: "ErrNoCredit", how: "push one request past the credits without waiting", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		q, req := s.reader(t, ctx)
		reqs := make([]krcore.Request, s.e.c.Node(1).Config().Credits+1)
		for i := range reqs {
			reqs[i] = req
		}
		n, err := q.Push(ctx, false, reqs...)
		if n != len(reqs)-1 {
			t.Errorf("%s: pushed %d of %d, want all the credits", s.name, n, len(reqs))
		}
		return err
	}},
	{sentinel: "ErrPortInUse", how: "bind a port another VQ holds", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		a, b := s.queue(t), s.queue(t)
		if err := a.Bind(4711); err != nil {
			t.Fatalf("%s: bind: %v", s.name, err)
		}
		defer a.Unbind()
		return b.Bind(4711)
	}},
	{sentinel: "ErrPortInUse", how: "bind a second port on a bound VQ", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		q := s.queue(t)
		if err := q.Bind(4711); err != nil {
			t.Fatalf("%s: bind: %v", s.name, err)
		}
		defer q.Unbind()
		return q.Bind(4712)
	}},
	{sentinel: "ErrNoRegion", how: "region of a name nobody exports", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		_, err := s.api.Region(ctx, 2, "nobody")
		return err
	}},
	{sentinel: "ErrUnreachable", how: "connect to a node nobody registered", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		return s.queue(t).Connect(ctx, 99, nil)
	}},
	{sentinel: "ErrUnreachable", how: "region of a node nobody registered", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		_, err := s.api.Region(ctx, 99, "table")
		return err
	}},
	{sentinel: "ErrRefused", how: "deregister another runtime's MR", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		return s.api.Deregister(s.e.table)
	}},
	{sentinel: "ErrRefused", how: "unexport a name nobody exported", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		return s.api.Unexport("nobody")
	}},
	{sentinel: "ErrRefused", how: "export from another runtime's MR", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		return s.api.Export("foreign", s.e.table, 0, 64, verbs.AccessRemoteRead)
	}},
	{sentinel: "ErrNoQP", how: "RC-only, one RC peer allowed, and it busy: connect to another",
		bed: func(b *sentinelBed) *env { return b.rcOnly },
		prepare: func(t *testing.T, ctx context.Context, b *sentinelBed) {
			// Node 2's RC QP stays busy with a READ to the dead node
			// until the transport's timeout, a minute away.
			s := &side{name: "embedded", api: core.Embed(b.rcOnly.c.Node(1)), e: b.rcOnly}
			q, req := s.reader(t, ctx)
			if err := b.rcOnly.c.Remove(2, true); err != nil {
				t.Fatal(err)
			}
			if _, err := q.Push(ctx, true, req); err != nil {
				t.Fatal(err)
			}
		},
		provoke: func(t *testing.T, ctx context.Context, s *side) error {
			return s.queue(t).Connect(ctx, 3, nil)
		}},
	{sentinel: "ErrPeerDead", how: "connect to a node found dead", bed: func(b *sentinelBed) *env { return b.main },
		prepare: killNode4,
		provoke: func(t *testing.T, ctx context.Context, s *side) error {
			return s.queue(t).Connect(ctx, 4, nil)
		}},
	{sentinel: "ErrPeerDead", how: "region of a node found dead", bed: func(b *sentinelBed) *env { return b.main },
		prepare: killNode4,
		provoke: func(t *testing.T, ctx context.Context, s *side) error {
			_, err := s.api.Region(ctx, 4, "r")
			return err
		}},
	{sentinel: "ErrInvalid", how: "RegMR of -1 bytes", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		_, err := s.api.RegMR(-1, verbs.AccessAll)
		return err
	}},
	{sentinel: "ErrInvalid", how: "RegMR of 0 bytes", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		_, err := s.api.RegMR(0, verbs.AccessAll)
		return err
	}},
	{sentinel: "ErrInvalid", how: "register Go memory", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		_, err := s.api.Register(make([]byte, 4096), verbs.AccessAll)
		return err
	}},
	{sentinel: "ErrInvalid", how: "RegMR with unknown access bits", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		_, err := s.api.RegMR(4096, verbs.Access(0xffff0000))
		return err
	}},
	{sentinel: "ErrInvalid", how: "export rights the MR lacks", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		m, err := s.api.RegMR(64, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
		if err != nil {
			t.Fatalf("%s: RegMR: %v", s.name, err)
		}
		defer s.api.Deregister(m)
		return s.api.Export("rights", m, 0, 64, verbs.AccessRemoteWrite)
	}},
	{sentinel: "ErrInvalid", how: "region of node 0", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		_, err := s.api.Region(ctx, 0, "table")
		return err
	}},
	{sentinel: "ErrInvalid", how: "connect to node 0", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		return s.queue(t).Connect(ctx, 0, nil)
	}},
	{sentinel: "ErrInvalid", how: "post an empty receive", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		return s.queue(t).PushRecv(s.mr(t, 64).Range(0, 0))
	}},
	{sentinel: "ErrInvalid", how: "bind port 0", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		return s.queue(t).Bind(0)
	}},
	{sentinel: "ErrInvalid", how: "export past the MR", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		return s.api.Export("past", s.mr(t, 64), 32, 64, verbs.AccessRemoteRead)
	}},
	{sentinel: "ErrInvalid", how: "post a receive past its MR", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		return s.queue(t).PushRecv(s.mr(t, 64).Range(32, 64))
	}},
	{sentinel: "ErrInvalid", how: "PopWait with no room", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		_, err := s.queue(t).PopWait(ctx, nil)
		return err
	}},
	{sentinel: "ErrInvalid", how: "region with a name longer than any export's", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		_, err := s.api.Region(ctx, 2, strings.Repeat("n", 600))
		return err
	}},
	{sentinel: "ErrInvalid", how: "region with a name longer than a control message", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		_, err := s.api.Region(ctx, 2, strings.Repeat("n", 70000))
		return err
	}},
	{sentinel: "ErrLimit", how: "RegMR past the device's MR count", bed: func(b *sentinelBed) *env { return b.fewMRs },
		provoke: func(t *testing.T, ctx context.Context, s *side) error {
			var mrs []krcore.MR
			defer func() {
				for _, m := range mrs {
					s.api.Deregister(m)
				}
			}()
			for range fewMRs {
				m, err := s.api.RegMR(64, verbs.AccessAll)
				if err != nil {
					return err
				}
				mrs = append(mrs, m)
			}
			t.Fatalf("%s: %d MRs registered on a device of %d", s.name, len(mrs), fewMRs)
			return nil
		}},
	{sentinel: "ErrBusy", how: "connect a VQ with a request outstanding to another node", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		q, req := s.reader(t, ctx)
		if _, err := q.Push(ctx, true, req); err != nil {
			t.Fatalf("%s: push: %v", s.name, err)
		}
		return q.Connect(ctx, 3, nil)
	}},
	{sentinel: "ErrBusy", how: "connect a VQ with a request outstanding to a node nobody registered", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		q, req := s.reader(t, ctx)
		if _, err := q.Push(ctx, true, req); err != nil {
			t.Fatalf("%s: push: %v", s.name, err)
		}
		return q.Connect(ctx, 99, nil)
	}},
	{sentinel: "ErrBusy", how: "export a name taken", provoke: func(t *testing.T, ctx context.Context, s *side) error {
		m := s.mr(t, 64)
		if err := s.api.Export("taken", m, 0, 64, verbs.AccessRemoteRead); err != nil {
			t.Fatalf("%s: export: %v", s.name, err)
		}
		defer s.api.Unexport("taken")
		return s.api.Export("taken", m, 0, 32, verbs.AccessRemoteRead)
	}},
}

// killNode4 exports a region on node 4, reads it from node 1, kills node 4
// and reads again: the READ fails (RETRY_EXC_ERR after the transport's
// timeout), and node 1's runtime knows node 4 dead.
func killNode4(t *testing.T, ctx context.Context, b *sentinelBed) {
	c := b.main.c
	if c.Node(4) == nil {
		return // an earlier scenario killed it
	}
	m, err := c.Node(4).RegMR(64, verbs.AccessAll)
	if err == nil {
		err = c.Node(4).Export("r", m, 0, 64, verbs.AccessRemoteRead)
	}
	if err != nil {
		t.Fatal(err)
	}
	s := &side{name: "embedded", api: core.Embed(c.Node(1)), e: b.main}
	q := s.queue(t)
	if err := q.Connect(ctx, 4, nil); err != nil {
		t.Fatal(err)
	}
	g, err := q.Region(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(4, true); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Push(ctx, true, krcore.Request{ID: 1, Op: verbs.OpRead, Local: s.mr(t, 64).Range(0, 8), Remote: g.At(0)}); err != nil {
		t.Fatal(err)
	}
	var out [1]krcore.Completion
	if _, err := q.PopWait(ctx, out[:]); err != nil || out[0].Status != verbs.RetryExcErr {
		t.Fatalf("READ from the killed node: %+v %v, want RETRY_EXC_ERR", out[0], err)
	}
}

// TestSentinelsAgree: every sentinel of the root package, provoked through
// the API alone, embedded (core.Embed on a cluster node's runtime) and
// through krcored serving that same runtime: the error matches the
// sentinel on both, and errors.Is answers the same on both for every
// root sentinel, so code that tests errors runs unchanged on either.
func TestSentinelsAgree(t *testing.T) {
	b := startSentinelBed(t)
	for _, tc := range sentinelCases {
		t.Run(tc.sentinel+"/"+strings.ReplaceAll(tc.how, " ", "_"), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			e := b.main
			if tc.bed != nil {
				e = tc.bed(b)
			}
			if tc.prepare != nil {
				tc.prepare(t, ctx, b)
			}
			want := sentinels[tc.sentinel]
			errs := map[string]error{}
			sides := []*side{{"embedded", core.Embed(e.c.Node(1)), e}, {"krcored", b.clients[e], e}}
			if tc.fresh {
				sides = []*side{{"embedded", core.Embed(b.newNode(t, ctx)), e}, {"krcored", attach(t, e), e}}
			}
			for _, s := range sides {
				err := tc.provoke(t, ctx, s)
				t.Logf("%s: %s", s.name, shortErr(err))
				if !errors.Is(err, want) {
					t.Errorf("%s: %s, want %s", s.name, shortErr(err), tc.sentinel)
				}
				errs[s.name] = err
			}
			diff := sentinelDiff(errs["embedded"], errs["krcored"])
			if len(diff) == 0 { // and what else crosses the socket: verbs', meta's ... sentinels, WC statuses
				diff = identityDiff(errs["embedded"], errs["krcored"])
			}
			for _, d := range diff {
				t.Error(d)
			}
		})
	}
}

// shortErr is err's text with the scenarios' long names cut.
func shortErr(err error) string {
	return regexp.MustCompile(`n{16,}`).ReplaceAllStringFunc(fmt.Sprint(err), func(run string) string {
		return fmt.Sprintf("nnn...(%d bytes)", len(run))
	})
}

// sentinelDiff lists the root sentinels errors.Is matches on one error
// and not the other.
func sentinelDiff(embedded, through error) []string {
	var diff []string
	for name, s := range sentinels {
		if e, k := errors.Is(embedded, s), errors.Is(through, s); e != k {
			diff = append(diff, fmt.Sprintf("errors.Is(err, %s): embedded %v, krcored %v", name, e, k))
		}
	}
	return diff
}

// TestDaemonGoneOnlyClient: ErrDaemonGone, which an embedded runtime
// cannot meet, is what a client's calls fail with once its daemon shut
// down, and nothing else of the root package.
func TestDaemonGoneOnlyClient(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	c := attach(t, e)
	q, err := c.Queue()
	if err != nil {
		t.Fatal(err)
	}
	e.stop()
	for what, err := range map[string]error{
		"Queue":   func() error { _, err := c.Queue(); return err }(),
		"Connect": q.Connect(ctx, 2, nil),
		"Region":  func() error { _, err := c.Region(ctx, 2, "table"); return err }(),
	} {
		for name, s := range sentinels {
			if got, want := errors.Is(err, s), name == "ErrDaemonGone"; got != want {
				t.Errorf("%s with the daemon gone: %v: errors.Is(err, %s) %v, want %v", what, err, name, got, want)
			}
		}
	}
}

// TestEverySentinelHasAScenario: every exported Err* of the root package
// (errors.go declares them) is in sentinels and has a scenario in
// sentinelCases, or a reason in notBoth why none can run on both
// implementations; a sentinel added later needs one.
func TestEverySentinelHasAScenario(t *testing.T) {
	declared := rootSentinels(t)
	covered := map[string]bool{}
	for _, tc := range sentinelCases {
		covered[tc.sentinel] = true
	}
	for _, name := range declared {
		if _, ok := sentinels[name]; !ok {
			t.Errorf("krcore.%s is not in sentinels", name)
		}
		if !covered[name] && notBoth[name] == "" {
			t.Errorf("krcore.%s has no scenario in sentinelCases and no reason in notBoth", name)
		}
	}
	if len(sentinels) != len(declared) {
		t.Errorf("sentinels has %d entries, the root package declares %d: %v", len(sentinels), len(declared), declared)
	}
}

// rootSentinels lists the exported variables named Err* that the root
// package declares (errors.go, or any other of its files).
func rootSentinels(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("the root package's files: %v", err)
	}
	var names []string
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.VAR {
				for _, spec := range g.Specs {
					for _, id := range spec.(*ast.ValueSpec).Names {
						if id.IsExported() && strings.HasPrefix(id.Name, "Err") {
							names = append(names, id.Name)
						}
					}
				}
			}
		}
	}
	return names
}

// TestRefusalsAgree: a malformed request, refused before it reaches a
// shared QP, completes with the same status (Completion.Err answers
// errors.Is the same) embedded and through krcored.
func TestRefusalsAgree(t *testing.T) {
	e := startCluster(t, cluster.Config{Nodes: 3, Runtime: core.Config{Logger: quiet}})
	ctx := ctxT(t)
	third, err := e.c.Node(3).RegMR(64, verbs.AccessAll)
	if err == nil {
		err = e.c.Node(3).Export("third", third, 0, 64, verbs.AccessRemoteRead)
	}
	if err != nil {
		t.Fatal(err)
	}
	type fixture struct {
		s     *side
		q     krcore.VQ
		buf   krcore.MR
		ro    krcore.MR // no LOCAL_WRITE
		gone  krcore.MR // deregistered
		g     krcore.Region
		other krcore.Region // node 3's, on a VQ connected to node 2
	}
	sides := []*side{{"embedded", core.Embed(e.c.Node(1)), e}, {"krcored", attach(t, e), e}}
	fx := map[string]*fixture{}
	for _, s := range sides {
		f := &fixture{s: s}
		f.q, _ = s.reader(t, ctx)
		f.buf = s.mr(t, 4096)
		var err error
		if f.ro, err = s.api.RegMR(64, verbs.AccessRemoteRead); err != nil {
			t.Fatal(err)
		}
		f.gone = s.mr(t, 64)
		s.api.Deregister(f.gone)
		if f.g, err = f.q.Region(ctx, "table"); err != nil {
			t.Fatal(err)
		}
		if f.other, err = s.api.Region(ctx, 3, "third"); err != nil {
			t.Fatal(err)
		}
		fx[s.name] = f
	}
	foreign := func(f *fixture) *fixture { // the other side's handles
		if f.s.name == "embedded" {
			return fx["krcored"]
		}
		return fx["embedded"]
	}
	for _, tc := range []struct {
		name string
		req  func(f *fixture) krcore.Request
	}{
		{"local past the MR", func(f *fixture) krcore.Request {
			return krcore.Request{Op: verbs.OpRead, Local: f.buf.Range(4090, 64), Remote: f.g.At(0)}
		}},
		{"local at a negative offset", func(f *fixture) krcore.Request {
			return krcore.Request{Op: verbs.OpRead, Local: f.buf.Range(-8, 8), Remote: f.g.At(0)}
		}},
		{"local of negative length", func(f *fixture) krcore.Request {
			return krcore.Request{Op: verbs.OpRead, Local: f.buf.Range(0, -8), Remote: f.g.At(0)}
		}},
		{"local offset overflowing", func(f *fixture) krcore.Request {
			return krcore.Request{Op: verbs.OpRead, Local: f.buf.Range(1<<62, 8), Remote: f.g.At(0)}
		}},
		{"local past the message limit", func(f *fixture) krcore.Request {
			return krcore.Request{Op: verbs.OpWrite, Local: f.buf.Range(0, 1<<31), Remote: f.g.At(0)}
		}},
		{"READ without a local buffer", func(f *fixture) krcore.Request {
			return krcore.Request{Op: verbs.OpRead, Remote: f.g.At(0)}
		}},
		{"READ into memory without LOCAL_WRITE", func(f *fixture) krcore.Request {
			return krcore.Request{Op: verbs.OpRead, Local: f.ro.Range(0, 8), Remote: f.g.At(0)}
		}},
		{"atomic on 4 bytes", func(f *fixture) krcore.Request {
			return krcore.Request{Op: verbs.OpFetchAdd, Local: f.buf.Range(0, 4), Remote: f.g.At(0)}
		}},
		{"deregistered MR", func(f *fixture) krcore.Request {
			return krcore.Request{Op: verbs.OpRead, Local: f.gone.Range(0, 8), Remote: f.g.At(0)}
		}},
		{"another runtime's MR", func(f *fixture) krcore.Request {
			return krcore.Request{Op: verbs.OpRead, Local: foreign(f).buf.Range(0, 8), Remote: f.g.At(0)}
		}},
		{"another runtime's region", func(f *fixture) krcore.Request {
			return krcore.Request{Op: verbs.OpRead, Local: f.buf.Range(0, 8), Remote: foreign(f).g.At(0)}
		}},
		{"another node's region", func(f *fixture) krcore.Request {
			return krcore.Request{Op: verbs.OpRead, Local: f.buf.Range(0, 8), Remote: f.other.At(0)}
		}},
		{"remote past the region", func(f *fixture) krcore.Request {
			return krcore.Request{Op: verbs.OpRead, Local: f.buf.Range(0, 64), Remote: f.g.At(4090)}
		}},
		{"no region", func(f *fixture) krcore.Request {
			return krcore.Request{Op: verbs.OpRead, Local: f.buf.Range(0, 8)}
		}},
		{"unknown opcode", func(f *fixture) krcore.Request {
			return krcore.Request{Op: verbs.Opcode(0x7f), Local: f.buf.Range(0, 8), Remote: f.g.At(0)}
		}},
		{"SEND on a VQ connected without a port", func(f *fixture) krcore.Request {
			return krcore.Request{Op: verbs.OpSend, Local: f.buf.Range(0, 8)}
		}},
		{"WRITE_WITH_IMM on a VQ connected without a port", func(f *fixture) krcore.Request {
			return krcore.Request{Op: verbs.OpWriteImm, Local: f.buf.Range(0, 8), Remote: f.g.At(0)}
		}},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			got := map[string]krcore.Completion{}
			for _, s := range sides {
				f := fx[s.name]
				r := tc.req(f)
				r.ID = 7
				c := run(t, ctx, f.q, r)[0]
				t.Logf("%s: %v", s.name, c.Err())
				if c.ID != 7 || c.Status == verbs.Success {
					t.Errorf("%s: completion %+v, want a refusal", s.name, c)
				}
				got[s.name] = c
			}
			if a, b := got["embedded"], got["krcored"]; a.Status != b.Status {
				t.Errorf("status embedded %s, krcored %s", a.Status, b.Status)
			}
		})
	}
}

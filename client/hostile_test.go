package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/verbs"
)

// TestHostileExportName: a name a client exported and lost (its MR
// deregistered, or unexported) and another client then exported is the
// other client's: the first can neither withdraw it (Unexport) nor take it
// with it when it goes (Close), in every order of losing it.
func TestHostileExportName(t *testing.T) {
	for _, tc := range []struct {
		name string
		lose func(a *client.Client, mr krcore.MR) error // a loses "shared"
		hit  func(a *client.Client) error               // a then acts on the name
	}{
		{"deregister then unexport", func(a *client.Client, mr krcore.MR) error { return a.Deregister(mr) },
			func(a *client.Client) error {
				if err := a.Unexport("shared"); !errors.Is(err, krcore.ErrRefused) {
					return errors.Join(errors.New("unexport of a lost name not refused"), err)
				}
				return nil
			}},
		{"deregister then close", func(a *client.Client, mr krcore.MR) error { return a.Deregister(mr) },
			func(a *client.Client) error { return a.Close() }},
		{"unexport then unexport", func(a *client.Client, _ krcore.MR) error { return a.Unexport("shared") },
			func(a *client.Client) error {
				if err := a.Unexport("shared"); !errors.Is(err, krcore.ErrRefused) {
					return errors.Join(errors.New("second unexport not refused"), err)
				}
				return nil
			}},
		{"unexport then close", func(a *client.Client, _ krcore.MR) error { return a.Unexport("shared") },
			func(a *client.Client) error { return a.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEnv(t)
			ctx := ctxT(t)
			a, b := attach(t, e), attach(t, e)
			mrA, err := a.RegMR(4096, verbs.AccessAll)
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Export("shared", mrA, 0, 64, verbs.AccessRemoteRead); err != nil {
				t.Fatal(err)
			}
			if err := tc.lose(a, mrA); err != nil {
				t.Fatal(err)
			}
			mrB, err := b.RegMR(4096, verbs.AccessAll)
			if err != nil {
				t.Fatal(err)
			}
			copy(mrB.Bytes(), "B's export")
			if err := b.Export("shared", mrB, 0, 64, verbs.AccessRemoteRead); err != nil {
				t.Fatalf("B exporting the name A lost: %v", err)
			}
			if err := tc.hit(a); err != nil {
				t.Error(err)
			}
			a.Close() // and when A goes, B's export stays
			waitFor(t, "A reclaimed", func() bool { return e.srv.Status().Reclaim == 1 })
			if _, err := e.c.Node(2).Region(ctxT(t), 1, "shared"); err != nil {
				t.Fatalf("B's export withdrawn by A: %v", err)
			}
			// and it still reads as B's, through the node's own runtime
			q, err := e.c.Node(2).Queue()
			if err != nil {
				t.Fatal(err)
			}
			defer q.Close()
			if err := q.Connect(ctx, 1, nil); err != nil {
				t.Fatal(err)
			}
			g, err := q.Region(ctx, "shared")
			if err != nil {
				t.Fatalf("B's export after A acted: %v", err)
			}
			buf, _ := e.c.Node(2).RegMR(64, verbs.AccessAll)
			out := run(t, ctx, q, krcore.Request{ID: 1, Op: verbs.OpRead, Local: buf.Range(0, 10), Remote: g.At(0)})
			if out[0].Err() != nil || string(buf.Bytes()[:10]) != "B's export" {
				t.Fatalf("READ of B's export: %v %q", out[0].Err(), buf.Bytes()[:10])
			}
		})
	}
}

// TestHostileAPI: bad arguments through the client API fail at once with
// the error that says why, never a hang: names too long for a control
// message, requests out of bounds or on a VQ not connected, and every call
// after Close.
func TestHostileAPI(t *testing.T) {
	e := startEnv(t)
	long := strings.Repeat("n", 70000) // more than a control message holds
	for _, tc := range []struct {
		name string
		call func(ctx context.Context, c *client.Client) error
		want error
	}{
		{"region with a long name", func(ctx context.Context, c *client.Client) error {
			_, err := c.Region(ctx, 2, long)
			return err
		}, verbs.ErrInvalid},
		{"export with a long name", func(_ context.Context, c *client.Client) error {
			mr, err := c.RegMR(4096, verbs.AccessAll)
			if err != nil {
				return err
			}
			return c.Export(long, mr, 0, 64, verbs.AccessRemoteRead)
		}, verbs.ErrInvalid},
		{"unexport with a long name", func(_ context.Context, c *client.Client) error { return c.Unexport(long) }, verbs.ErrInvalid},
		{"VQ region with a long name", func(ctx context.Context, c *client.Client) error {
			q, err := c.Queue()
			if err != nil {
				return err
			}
			defer q.Close()
			if err := q.Connect(ctx, 2, nil); err != nil {
				return err
			}
			_, err = q.Region(ctx, long)
			return err
		}, verbs.ErrInvalid},
		{"region of node 0", func(ctx context.Context, c *client.Client) error {
			_, err := c.Region(ctx, 0, "table")
			return err
		}, nil},
		{"region with an empty name", func(ctx context.Context, c *client.Client) error {
			_, err := c.Region(ctx, 2, "")
			return err
		}, nil},
		{"RegMR of 0 bytes", func(_ context.Context, c *client.Client) error {
			_, err := c.RegMR(0, verbs.AccessAll)
			return err
		}, nil},
		{"RegMR of -1 bytes", func(_ context.Context, c *client.Client) error {
			_, err := c.RegMR(-1, verbs.AccessAll)
			return err
		}, nil},
		{"RegMR with unknown access bits", func(_ context.Context, c *client.Client) error {
			_, err := c.RegMR(4096, verbs.Access(0xffff0000))
			return err
		}, verbs.ErrInvalid},
		{"RegMR past the client's limit", func(_ context.Context, c *client.Client) error {
			_, err := c.RegMR(2<<30, verbs.AccessAll)
			return err
		}, verbs.ErrLimit},
		{"register Go memory", func(_ context.Context, c *client.Client) error {
			_, err := c.Register(make([]byte, 4096), verbs.AccessAll)
			return err
		}, nil},
		{"export past the MR", func(_ context.Context, c *client.Client) error {
			mr, err := c.RegMR(4096, verbs.AccessAll)
			if err != nil {
				return err
			}
			return c.Export("past", mr, 4000, 200, verbs.AccessRemoteRead)
		}, verbs.ErrInvalid},
		{"export rights the MR lacks", func(_ context.Context, c *client.Client) error {
			mr, err := c.RegMR(4096, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
			if err != nil {
				return err
			}
			return c.Export("rights", mr, 0, 64, verbs.AccessRemoteWrite)
		}, verbs.ErrInvalid},
		{"deregister twice", func(_ context.Context, c *client.Client) error {
			mr, err := c.RegMR(4096, verbs.AccessAll)
			if err != nil {
				return err
			}
			if err := c.Deregister(mr); err != nil {
				return err
			}
			return c.Deregister(mr)
		}, nil},
		{"close twice", func(_ context.Context, c *client.Client) error {
			c.Close()
			return c.Close()
		}, krcore.ErrClosed},
		{"RegMR after close", func(_ context.Context, c *client.Client) error {
			c.Close()
			_, err := c.RegMR(4096, verbs.AccessAll)
			return err
		}, krcore.ErrClosed},
		{"queue after close", func(_ context.Context, c *client.Client) error {
			c.Close()
			_, err := c.Queue()
			return err
		}, krcore.ErrClosed},
		{"region after close", func(ctx context.Context, c *client.Client) error {
			c.Close()
			_, err := c.Region(ctx, 2, "table")
			return err
		}, krcore.ErrClosed},
		{"push after close", func(ctx context.Context, c *client.Client) error {
			q, g := connect(t, ctx, c)
			buf, _ := c.RegMR(64, verbs.AccessAll)
			c.Close()
			_, err := q.Push(ctx, true, krcore.Request{ID: 1, Op: verbs.OpRead, Local: buf.Range(0, 8), Remote: g.At(0)})
			return err
		}, krcore.ErrClosed},
		{"popwait after close", func(ctx context.Context, c *client.Client) error {
			q, _ := connect(t, ctx, c)
			c.Close()
			_, err := q.PopWait(ctx, make([]krcore.Completion, 1))
			return err
		}, krcore.ErrClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := attach(t, e)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := tc.call(ctx, c)
			msg := strings.ReplaceAll(fmt.Sprint(err), long, "<long name>")
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("waited out its deadline: %s", msg)
			}
			if tc.want == nil {
				if err == nil {
					t.Fatal("accepted")
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("%s, want %v", msg, tc.want)
			}
		})
	}
}

// TestHostileVQ: requests a VQ cannot carry complete with an error status
// or fail the call, at once, and leave the VQ (and the other clients)
// working: out-of-bounds local ranges, a VQ not connected, a port bound
// twice by two clients.
func TestHostileVQ(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	a, b := attach(t, e), attach(t, e)
	q, g := connect(t, ctx, a)
	buf, err := a.RegMR(4096, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		req  krcore.Request
	}{
		{"local past the MR", krcore.Request{Op: verbs.OpRead, Local: buf.Range(4090, 64), Remote: g.At(0)}},
		{"local at a negative offset", krcore.Request{Op: verbs.OpRead, Local: buf.Range(-8, 8), Remote: g.At(0)}},
		{"local of negative length", krcore.Request{Op: verbs.OpRead, Local: buf.Range(0, -8), Remote: g.At(0)}},
		{"local offset overflowing", krcore.Request{Op: verbs.OpRead, Local: buf.Range(1<<62, 8), Remote: g.At(0)}},
		{"remote past the region", krcore.Request{Op: verbs.OpRead, Local: buf.Range(0, 64), Remote: g.At(1 << 40)}},
		{"unknown opcode", krcore.Request{Op: verbs.Opcode(0x7f), Local: buf.Range(0, 8), Remote: g.At(0)}},
		{"no region", krcore.Request{Op: verbs.OpRead, Local: buf.Range(0, 8)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.ID = 7
			out := run(t, ctx, q, tc.req)
			if out[0].ID != 7 || out[0].Err() == nil {
				t.Fatalf("completion %+v, want an error", out[0])
			}
			// and the VQ still works
			out = run(t, ctx, q, krcore.Request{ID: 8, Op: verbs.OpRead, Local: buf.Range(0, 8), Remote: g.At(0)})
			if out[0].Err() != nil {
				t.Fatalf("next READ: %v", out[0].Err())
			}
		})
	}
	t.Run("not connected", func(t *testing.T) {
		nq, err := a.Queue()
		if err != nil {
			t.Fatal(err)
		}
		defer nq.Close()
		_, err = nq.Push(ctx, true, krcore.Request{ID: 1, Op: verbs.OpRead, Local: buf.Range(0, 8), Remote: g.At(0)})
		if err == nil {
			n, perr := nq.PopWait(ctx, make([]krcore.Completion, 1))
			if perr != nil || n != 1 {
				t.Fatalf("pop: %d %v", n, perr)
			}
		}
		if _, err := nq.Region(ctx, "table"); !errors.Is(err, krcore.ErrNotConnected) {
			t.Errorf("region on a VQ not connected: %v", err)
		}
	})
	t.Run("port bound twice", func(t *testing.T) {
		qa, _ := a.Queue()
		defer qa.Close()
		qb, _ := b.Queue()
		defer qb.Close()
		if err := qa.Bind(4242); err != nil {
			t.Fatal(err)
		}
		if err := qb.Bind(4242); !errors.Is(err, krcore.ErrPortInUse) {
			t.Fatalf("B binding A's port: %v, want ErrPortInUse", err)
		}
	})
}

// TestRegMRPastHost: a RegMR the host cannot map (1 PiB) fails at once,
// named as the client's register and wrapping the system's error, as
// every other refused RegMR is; the client stays usable.
func TestRegMRPastHost(t *testing.T) {
	e := startEnv(t)
	c := attach(t, e)
	_, err := c.RegMR(1<<50, verbs.AccessAll)
	if err == nil || !strings.HasPrefix(err.Error(), "client: register") || errors.Unwrap(err) == nil {
		t.Fatalf("RegMR of 1 PiB: %v, want a wrapped error named client: register", err)
	}
	if _, err := c.RegMR(4096, verbs.AccessAll); err != nil {
		t.Fatalf("RegMR after the refused one: %v", err)
	}
}

package client_test

import (
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/verbs"
)

// TestForgetRegion: a region looked up again and again leaves the daemon's
// table of the client's regions as it was once each is forgotten (it grew
// by one a lookup until the client detached); a request naming a
// forgotten region is refused, and another handle on the same region still
// READs, whatever another client that forged a handle on it forgets. Against a daemon without FeatureForget, Forget does nothing.
func TestForgetRegion(t *testing.T) {
	e := startEnv(t)
	for _, mode := range []string{"forget", "first protocol"} {
		t.Run(mode, func(t *testing.T) {
			ctx := ctxT(t)
			c := attach(t, e)
			if mode == "first protocol" {
				client.WithoutFeatures(c)
			}
			q, keep, err := c.QueueTo(ctx, 2, nil, "table")
			if err != nil {
				t.Fatal(err)
			}
			defer q.Close()
			before := clientStatus(e, c).Regions
			for range 20 {
				g, err := q.Region(ctx, "table")
				if err != nil {
					t.Fatal(err)
				}
				if err := g.(krcore.Forgetter).Forget(); err != nil {
					t.Fatal(err)
				}
			}
			want := before
			if mode == "first protocol" {
				want += 20
			}
			// Forget does not wait for the daemon's answer; the daemon
			// takes a client's calls in order, so a round trip after it
			// is answered after the forgets were done.
			if _, err := c.Status(ctx); err != nil {
				t.Fatal(err)
			}
			if n := clientStatus(e, c).Regions; n != want {
				t.Fatalf("the daemon holds %d regions of the client after 20 lookups forgotten, want %d", n, want)
			}
			buf, err := c.RegMR(64, verbs.AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Deregister(buf)
			g, err := q.Region(ctx, "table")
			if err != nil {
				t.Fatal(err)
			}
			g.(krcore.Forgetter).Forget()
			out := run(t, ctx, q, krcore.Request{ID: 1, Op: verbs.OpRead, Local: buf.Range(0, 8), Remote: g.At(0)})
			if out[0].Err() == nil {
				t.Error("a READ of a forgotten region succeeded")
			}
			// Another client that forges a handle on keep (its id) forgets
			// nothing of this one's.
			other := attach(t, e)
			if err := client.StealRegion(other, keep).(krcore.Forgetter).Forget(); err != nil {
				t.Fatal(err)
			}
			if _, err := other.Status(ctx); err != nil { // after the forget
				t.Fatal(err)
			}
			out = run(t, ctx, q, krcore.Request{ID: 2, Op: verbs.OpRead, Local: buf.Range(0, 5), Remote: keep.At(0)})
			if err := out[0].Err(); err != nil || string(buf.Bytes()[:5]) != "hello" {
				t.Fatalf("READ of the region kept: %v, %q", err, buf.Bytes()[:5])
			}
		})
	}
}

package krcore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/testcluster"
	"github.com/krcore/krcore/verbs"
)

// TestQueueTo runs krcore.QueueTo embedded (Queue, Connect, Region) and
// through krcored (the client's one round trip): the queue it makes READs
// the region it learned; without a name it is only connected; a region not
// exported fails with ErrNoRegion and leaves no queue.
func TestQueueTo(t *testing.T) {
	others, apis := testcluster.APIs(t, 2)
	peer := others[0] // node 2, embedded
	mr, err := peer.RegMR(64, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	copy(mr.Bytes(), "from node 2")
	if err := peer.Export("dial", mr, 0, 64, verbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	for name, api := range apis {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			buf, err := api.RegMR(64, verbs.AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			defer api.Deregister(buf)
			q, g, err := krcore.QueueTo(ctx, api, peer.Node(), nil, "dial")
			if err != nil {
				t.Fatal(err)
			}
			defer q.Close()
			if err := q.PushOne(ctx, true, krcore.Request{ID: 1, Op: verbs.OpRead, Local: buf.Range(0, 11), Remote: g.At(0)}); err != nil {
				t.Fatal(err)
			}
			var out [1]krcore.Completion
			if _, err := q.PopWait(ctx, out[:]); err != nil {
				t.Fatal(err)
			}
			if err := out[0].Err(); err != nil || string(buf.Bytes()[:11]) != "from node 2" {
				t.Fatalf("READ: %v, %q", err, buf.Bytes()[:11])
			}
			q2, g2, err := krcore.QueueTo(ctx, api, peer.Node(), nil, "")
			if err != nil || g2 != nil {
				t.Fatalf("QueueTo without a name: region %v, %v", g2, err)
			}
			defer q2.Close()
			vqs := api.Stats().VQs
			if _, _, err := krcore.QueueTo(ctx, api, peer.Node(), nil, "no such region"); !errors.Is(err, krcore.ErrNoRegion) {
				t.Fatalf("QueueTo a region not exported: %v, want ErrNoRegion", err)
			}
			if n := api.Stats().VQs; n != vqs {
				t.Fatalf("%d queues after a failed QueueTo, want %d", n, vqs)
			}
		})
	}
}

// TestQueueToNil: QueueTo without an API and ConnectQueue without a queue
// fail with ErrInvalid (they panicked on the nil interface).
func TestQueueToNil(t *testing.T) {
	ctx := context.Background()
	if q, g, err := krcore.QueueTo(ctx, nil, 2, nil, "x"); !errors.Is(err, krcore.ErrInvalid) || q != nil || g != nil {
		t.Errorf("QueueTo(nil API): %v, %v, %v; want ErrInvalid", q, g, err)
	}
	if q, g, err := krcore.ConnectQueue(ctx, nil, 2, nil, "x"); !errors.Is(err, krcore.ErrInvalid) || q != nil || g != nil {
		t.Errorf("ConnectQueue(nil queue): %v, %v, %v; want ErrInvalid", q, g, err)
	}
}

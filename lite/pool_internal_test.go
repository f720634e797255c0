package lite

import (
	"testing"

	"github.com/krcore/krcore"
)

// countingVQ counts its closes; nothing else of it is used.
type countingVQ struct {
	krcore.VQ
	closes *int
}

func (q countingVQ) Close() error { *q.closes++; return nil }

// TestPoolEvictsWhenFull: a full pool of idle queues retires its oldest
// to keep the one given back now, instead of refusing it (queues to
// callers long gone would fill it for good).
func TestPoolEvictsWhenFull(t *testing.T) {
	p := &vqPool{idle: map[krcore.Principal][]*pooled{}, all: map[*pooled]bool{}}
	closes := 0
	const over = 3
	for i := range maxIdle + over {
		e := &pooled{q: countingVQ{closes: &closes}}
		p.all[e] = true
		p.put(krcore.Principal{Node: 1, Port: uint32(i)}, e)
	}
	if p.nidle != maxIdle || closes != over || len(p.all) != maxIdle {
		t.Fatalf("after %d puts: %d idle, %d closed, %d kept; want %d, %d, %d", maxIdle+over, p.nidle, closes, len(p.all), maxIdle, over, maxIdle)
	}
	if newest := (krcore.Principal{Node: 1, Port: maxIdle + over - 1}); len(p.idle[newest]) != 1 {
		t.Fatalf("the queue given back last was not kept")
	}
}

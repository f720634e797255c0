package core_test

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// TestGroupWait: one goroutine waits for two queues through a Group; a
// completion on either wakes it, and so does Wake.
func TestGroupWait(t *testing.T) {
	c := start(t, 2, core.Config{})
	a := c.Node(1)
	serve(t, c.Node(2), "g", 64)
	g := a.Group()
	var qs []*core.Queue
	for range 2 {
		q, _ := a.Queue()
		if err := q.Connect(ctx(t), 2, nil); err != nil {
			t.Fatal(err)
		}
		g.Add(q)
		qs = append(qs, q)
	}
	region, err := qs[0].Region(ctx(t), "g")
	if err != nil {
		t.Fatal(err)
	}
	buf, _ := a.RegMR(64, verbs.AccessAll)
	out := make([]krcore.Completion, 4)
	for i, q := range qs {
		if _, err := q.Push(ctx(t), false, krcore.Request{ID: uint64(i), Op: verbs.OpRead, Local: buf.Range(0, 8), Remote: region.At(0)}); err != nil {
			t.Fatal(err)
		}
		err := g.Wait(ctx(t), func() bool { return g.Pop(q, out) > 0 }, nil)
		if err != nil || out[0].ID != uint64(i) || out[0].Err() != nil {
			t.Fatalf("queue %d: %v %+v", i, err, out[0])
		}
	}
	woken := make(chan error, 1)
	var flag atomic.Bool
	armed := make(chan struct{})
	var once sync.Once
	go func() {
		woken <- g.Wait(ctx(t), flag.Load, func() { once.Do(func() { close(armed) }) })
	}()
	<-armed
	select {
	case err := <-woken:
		t.Fatalf("Wait returned with nothing to do: %v", err)
	default:
	}
	flag.Store(true)
	g.Wake()
	if err := <-woken; err != nil {
		t.Fatal(err)
	}
}

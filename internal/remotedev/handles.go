package remotedev

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/krcore/krcore/verbs"
)

// Close order when a session ends: users before what they use (a PD is
// busy while MRs live, a CQ while QPs do).
const (
	orderQP = iota
	orderAH
	orderSRQ
	orderMR
	orderCQ
	orderPD
)

// object is a server-side verbs object named by a handle.
type object struct {
	v       io.Closer
	order   int
	release func() // after a successful Close; nil if nothing to release
}

// handles is a session's table of objects.
type handles struct {
	mu   sync.Mutex
	next uint64
	objs map[uint64]*object
}

// add names a newly created object; it passes a creation error through.
func (t *handles) add(v io.Closer, err error) (uint64, error) {
	if err != nil {
		return 0, err
	}
	return t.addWith(v, orderOf(v), nil)
}

func (t *handles) addWith(v io.Closer, order int, release func()) (uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	t.objs[t.next] = &object{v: v, order: order, release: release}
	return t.next, nil
}

func orderOf(v io.Closer) int {
	switch v.(type) {
	case verbs.QP:
		return orderQP
	case verbs.AH:
		return orderAH
	case verbs.SRQ:
		return orderSRQ
	case verbs.MR:
		return orderMR
	case verbs.CQ:
		return orderCQ
	}
	return orderPD
}

// get returns handle h's object as a T. An unknown handle is an object
// already closed.
func get[T any](t *handles, h uint64) (T, error) {
	var zero T
	t.mu.Lock()
	o := t.objs[h]
	t.mu.Unlock()
	if o == nil {
		return zero, fmt.Errorf("remote: object %d: %w", h, verbs.ErrClosed)
	}
	v, ok := o.v.(T)
	if !ok {
		return zero, fmt.Errorf("remote: object %d is a %T, not a %T: %w", h, o.v, zero, verbs.ErrInvalid)
	}
	return v, nil
}

// close closes handle h's object and forgets it if that worked (a busy PD
// stays named).
func (t *handles) close(h uint64) error {
	t.mu.Lock()
	o := t.objs[h]
	t.mu.Unlock()
	if o == nil {
		return fmt.Errorf("remote: object %d: %w", h, verbs.ErrClosed)
	}
	if err := o.v.Close(); err != nil {
		return err
	}
	t.forget(h)
	return nil
}

// forget drops h; only the caller that removed it runs its release.
func (t *handles) forget(h uint64) {
	t.mu.Lock()
	o := t.objs[h]
	delete(t.objs, h)
	t.mu.Unlock()
	if o != nil && o.release != nil {
		o.release()
	}
}

// closeAll closes every object, users first. Errors are dropped: this is
// the last chance, and a device already closed refuses some of them.
func (t *handles) closeAll() {
	t.mu.Lock()
	hs := make([]uint64, 0, len(t.objs))
	for h := range t.objs {
		hs = append(hs, h)
	}
	order := func(h uint64) int { return t.objs[h].order }
	slices.SortFunc(hs, func(a, b uint64) int { return cmp.Or(cmp.Compare(order(a), order(b)), cmp.Compare(a, b)) })
	t.mu.Unlock()
	for _, h := range hs {
		t.close(h)
		t.forget(h) // even if Close failed: nothing will name it again
	}
}

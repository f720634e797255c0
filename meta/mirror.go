package meta

import (
	"context"
	"sync"
	"time"
)

// A MetaServer with a Membership mirrors it: follow watches the store and
// queues its updates in the feed, the loop goroutine (the table's only
// writer) applies them, and announce keeps the server listed in the store.

// feed carries membership updates from follow to the loop, waking the
// loop's sleep when one arrives.
type feed struct {
	mu      sync.Mutex
	pending []Update
	wake    context.CancelFunc // cancels the loop's sleep; nil while it is awake
}

// push queues u and wakes the loop.
func (f *feed) push(u Update) {
	f.mu.Lock()
	f.pending = append(f.pending, u)
	if f.wake != nil {
		f.wake()
		f.wake = nil
	}
	f.mu.Unlock()
}

// take returns and clears the queued updates.
func (f *feed) take() []Update {
	f.mu.Lock()
	defer f.mu.Unlock()
	us := f.pending
	f.pending = nil
	return us
}

// sleeping derives the context the loop sleeps on, which push cancels; it
// is already cancelled when updates are queued.
func (f *feed) sleeping(ctx context.Context, cancel context.CancelFunc) (context.Context, context.CancelFunc) {
	wctx, wcancel := context.WithCancel(ctx)
	f.mu.Lock()
	if len(f.pending) > 0 {
		wcancel()
	} else {
		f.wake = wcancel
	}
	f.mu.Unlock()
	return wctx, func() { wcancel(); cancel() }
}

// awake marks the loop as no longer sleeping.
func (f *feed) awake() {
	f.mu.Lock()
	f.wake = nil
	f.mu.Unlock()
}

// mirrorPending applies the queued updates to the table. Loop only.
func (s *Server) mirrorPending() {
	for _, u := range s.feed.take() {
		s.mirror(u)
		s.stats.updates.Add(1)
	}
}

// mirror applies one update: a Reset removes every record it does not
// hold, Gone removes, Put stores. Mirrored records carry no lease here:
// the store lapses them. Loop only.
func (s *Server) mirror(u Update) {
	if u.Reset {
		keep := make(map[uint64]bool, len(u.Put))
		for _, r := range u.Put {
			keep[r.Node] = true
		}
		for node, e := range s.entries {
			if !keep[node] {
				s.remove(e)
			}
		}
	}
	for _, node := range u.Gone {
		if e := s.entries[node]; e != nil {
			s.remove(e)
		}
	}
	for _, r := range u.Put {
		if r.Validate() != nil {
			s.stats.dropped.Add(1)
			continue
		}
		if _, err := s.store(r.content()); err != nil {
			s.stats.unplaced.Add(1)
		}
	}
}

// follow watches the Membership until Close, starting a new watch (after
// a pause that doubles up to a second) whenever one fails.
func (s *Server) follow() {
	defer s.wg.Done()
	pause := 10 * time.Millisecond
	for s.ctx.Err() == nil {
		s.stats.watches.Add(1)
		began := time.Now()
		s.cfg.Membership.Watch(s.ctx, s.feed.push)
		if time.Since(began) > time.Second {
			pause = 10 * time.Millisecond // the watch was healthy: this is a fresh break
		}
		if !sleepCtx(s.ctx, pause) {
			return
		}
		pause = min(2*pause, time.Second)
	}
}

// announce lists the server in the Membership until Close, retrying until
// the store takes it, and withdraws it on Close.
func (s *Server) announce() {
	defer s.wg.Done()
	pause := 10 * time.Millisecond
	for {
		lease, err := s.cfg.Membership.Announce(s.ctx, s.info, s.cfg.Lease)
		if err == nil {
			<-s.ctx.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			lease.Close(ctx)
			return
		}
		if !sleepCtx(s.ctx, pause) {
			return
		}
		pause = min(2*pause, time.Second)
	}
}

// sleepCtx waits d; false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

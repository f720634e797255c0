package rawqp

import (
	"context"
	"time"
)

// Deadline hands out a context whose deadline is at least timeout/2 away,
// making a new one only when the old one gets closer: every wait is
// bounded without arming a timer inside each measured operation.
type Deadline struct {
	parent  context.Context
	timeout time.Duration
	ctx     context.Context
	cancel  context.CancelFunc
	at      time.Time
}

// NewDeadline hands out contexts under parent, each timeout from its making.
func NewDeadline(parent context.Context, timeout time.Duration) *Deadline {
	return &Deadline{parent: parent, timeout: timeout}
}

// Get is a context whose deadline is at least timeout/2 away.
func (d *Deadline) Get() context.Context {
	now := time.Now()
	if d.ctx == nil || d.at.Sub(now) < d.timeout/2 {
		d.Close()
		d.at = now.Add(d.timeout)
		d.ctx, d.cancel = context.WithDeadline(d.parent, d.at)
	}
	return d.ctx
}

// At is when the context last handed out expires.
func (d *Deadline) At() time.Time { return d.at }

// Close cancels the context last handed out.
func (d *Deadline) Close() {
	if d.cancel != nil {
		d.cancel()
		d.ctx, d.cancel = nil, nil
	}
}

package poprole

import (
	"context"
	"errors"
	"testing"
	"time"
)

// takeOrNeed is TakeOrWait for a role that is not patient (its ticket is
// 0, and Unneed undoes its count).
func takeOrNeed(r *Role) bool {
	taken, _ := r.TakeOrWait()
	return taken
}

// free is a role nobody holds, left long ago.
func free() *Role {
	r := New()
	r.by = Free
	return r
}

// woken reports whether the serving goroutine was woken, and takes the
// token.
func woken(r *Role) bool {
	select {
	case <-r.wake:
		return true
	default:
		return false
	}
}

// TestLendAndNeed: a waiter takes the role when nobody pops and keeps it
// lent when it leaves; a second waiter needs the serving goroutine, and
// the first one leaving then hands the role to the serving goroutine at
// once, which otherwise takes a lent or free role back only after
// LendFor and keeps it while a waiter needs it.
func TestLendAndNeed(t *testing.T) {
	r := free()
	if !takeOrNeed(r) {
		t.Fatal("a waiter did not take the free role")
	}
	if takeOrNeed(r) {
		t.Fatal("a second waiter took the role a waiter holds")
	}
	if ok, _ := r.takeForServe(); ok {
		t.Fatal("the serving goroutine took the role a waiter holds")
	}
	r.Lend()
	if !woken(r) {
		t.Fatal("a waiter leaving with another in need did not wake the serving goroutine")
	}
	if ok, _ := r.takeForServe(); !ok {
		t.Fatal("the serving goroutine did not take the role a waiter needs")
	}
	r.Unneed()
	r.leaveServe(true)
	if r.State() != Free {
		t.Fatal("the serving goroutine kept the role with nobody in need")
	}
	if ok, wait := r.takeForServe(); ok || wait <= 0 || wait > LendFor {
		t.Fatalf("the serving goroutine took the role it just left (%v) or waits %v", ok, wait)
	}
	if !takeOrNeed(r) {
		t.Fatal("a waiter did not take the role the serving goroutine left")
	}
	r.Lend()
	if woken(r) {
		t.Fatal("a waiter leaving alone woke the serving goroutine")
	}
	if ok, _ := r.takeForServe(); ok {
		t.Fatal("the serving goroutine took a role just lent")
	}
	r.since = r.since.Add(-LendFor)
	if ok, _ := r.takeForServe(); !ok {
		t.Fatal("the serving goroutine did not take a role lent for LendFor")
	}
	if takeOrNeed(r) {
		t.Fatal("a waiter took the role the serving goroutine holds")
	}
	r.leaveServe(true)
	if r.State() != Serving {
		t.Fatal("the serving goroutine left the role with a waiter in need")
	}
	r.Unneed()
	r.leaveServe(false)
	if r.State() != Serving {
		t.Fatal("the serving goroutine left the role after a batch that woke nobody")
	}
}

// TestPatient: in a patient role, only fresh waiters hurry the serving
// goroutine. One that waited 2*FreshFor or more, or one Need counted, does
// not: the serving goroutine leaves the role free after a batch that woke
// a waiter, a waiter lending the role does not wake it, and it takes a
// lent role back only after LendFor. A fresh waiter hurries it as in a
// role that is not patient; a returned role it takes at once.
func TestPatient(t *testing.T) {
	r := NewPatient()
	taken, ticket := r.TakeOrWait()
	if taken || ticket == 0 {
		t.Fatalf("a waiter took the role the serving goroutine holds (%v), or has no ticket", taken)
	}
	r.leaveServe(true)
	if r.State() != Serving {
		t.Fatal("the serving goroutine left the role with a fresh waiter in need")
	}
	r.start = r.start.Add(-2 * FreshFor) // the waiter has waited 2*FreshFor
	r.leaveServe(true)
	if r.State() != Free {
		t.Fatal("the serving goroutine kept the role after a batch that woke a waiter, with only an idle waiter in need")
	}
	if !r.TryTake() {
		t.Fatal("a waiter did not take the role the serving goroutine left")
	}
	r.Need()
	r.Lend()
	if woken(r) {
		t.Fatal("a waiter lending the role with idle waiters in need woke the serving goroutine")
	}
	r.since = r.since.AddDate(1, 0, 0) // as if just lent, however late this runs
	if ok, _ := r.takeForServe(); ok {
		t.Fatal("the serving goroutine took a role just lent, with idle waiters in need")
	}
	r.since = time.Now().Add(-LendFor)
	if ok, _ := r.takeForServe(); !ok {
		t.Fatal("the serving goroutine did not take a role lent for LendFor")
	}
	r.Unwait(ticket)
	r.Unneed()
	if got := r.Needing(); got != 0 {
		t.Fatalf("need %d after every Unwait, want 0", got)
	}
	r.leaveServe(true)
	if !r.TryTake() {
		t.Fatal("a waiter did not take the role the serving goroutine left")
	}
	taken, ticket = r.TakeOrWait()
	if taken {
		t.Fatal("a waiter took the role a waiter holds")
	}
	r.Lend()
	if !woken(r) {
		t.Fatal("a waiter lending the role with a fresh waiter in need did not wake the serving goroutine")
	}
	if ok, _ := r.takeForServe(); !ok {
		t.Fatal("the serving goroutine did not take the role a fresh waiter needs")
	}
	r.Unwait(ticket)
	r.leaveServe(true)
	if !r.TryTake() {
		t.Fatal("a waiter did not take the role once the fresh waiter was uncounted")
	}
	r.Return()
	if !woken(r) {
		t.Fatal("a waiter returning the role did not wake the serving goroutine")
	}
	if ok, _ := r.takeForServe(); !ok {
		t.Fatal("the serving goroutine did not take a returned role at once")
	}
}

// TestNeedWhilePopping: a goroutine that starts to need the serving
// goroutine while a waiter pops does not wake it (the waiter pops what
// comes); the waiter lending the role then does, so that what comes after
// is popped at once, not after LendFor. Need on a free role wakes it
// itself.
func TestNeedWhilePopping(t *testing.T) {
	r := free()
	if !r.TryTake() {
		t.Fatal("a waiter did not take the free role")
	}
	r.Need()
	if woken(r) {
		t.Fatal("Need woke the serving goroutine while a waiter pops")
	}
	r.Lend()
	if !woken(r) {
		t.Fatal("a waiter lending the role while a goroutine needs the serving goroutine did not wake it")
	}
	if ok, _ := r.takeForServe(); !ok {
		t.Fatal("the serving goroutine did not take the role a goroutine needs")
	}
	r.Unneed()

	r = free()
	r.since = r.since.AddDate(1, 0, 0) // as if just lent
	r.Need()
	if !woken(r) {
		t.Fatal("Need on a free role did not wake the serving goroutine")
	}
	if ok, _ := r.takeForServe(); !ok {
		t.Fatal("the serving goroutine did not take a free role a goroutine needs")
	}
}

// TestReturnAndFail: a waiter leaving with nothing returns the role to the
// serving goroutine at once; one whose pop failed does too, and no waiter
// takes the role before the serving goroutine has popped well; a stopped
// role nobody takes.
func TestReturnAndFail(t *testing.T) {
	r := free()
	r.TryTake()
	r.Return()
	if !woken(r) {
		t.Fatal("a waiter returning the role did not wake the serving goroutine")
	}
	if !r.TryTake() {
		t.Fatal("a waiter did not take a returned role")
	}
	r.Return()
	if ok, _ := r.takeForServe(); !ok {
		t.Fatal("the serving goroutine did not take a returned role at once")
	}

	r = free()
	r.TryTake()
	r.Fail()
	if !woken(r) {
		t.Fatal("a waiter whose pop failed did not wake the serving goroutine")
	}
	if r.TryTake() || takeOrNeed(r) {
		t.Fatal("a waiter took a failing role")
	}
	r.Unneed()
	if ok, _ := r.takeForServe(); !ok {
		t.Fatal("the serving goroutine did not take a failing role at once")
	}
	r.leaveServe(true)
	if !r.TryTake() {
		t.Fatal("a waiter did not take the role after the serving goroutine popped well")
	}

	r = New()
	r.Stop()
	if r.TryTake() {
		t.Fatal("a waiter took a stopped role")
	}
}

// TestServe: Serve runs batches while the role is its own and returns
// the batch's error, or ctx's when ctx ends while a waiter holds the role.
func TestServe(t *testing.T) {
	errPort := errors.New("port failed")
	r := New()
	n := 0
	err := r.Serve(context.Background(), func(context.Context) (bool, error) {
		n++
		if n == 3 {
			return false, errPort
		}
		return false, nil
	})
	if !errors.Is(err, errPort) || n != 3 {
		t.Fatalf("Serve: %v after %d batches; want %v after 3", err, n, errPort)
	}

	r = free()
	r.TryTake()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = r.Serve(ctx, func(context.Context) (bool, error) {
		t.Error("a batch ran while a waiter holds the role")
		return false, nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Serve with ctx cancelled: %v; want %v", err, context.Canceled)
	}
}

// TestStopWaitsForPopping: the serving goroutine stopping waits for a
// popping waiter to leave (whoever waits for it to stop may free what the
// waiter's messages are in), and no waiter takes the role after.
func TestStopWaitsForPopping(t *testing.T) {
	r := free()
	if !r.TryTake() {
		t.Fatal("a waiter did not take the free role")
	}
	stopped := make(chan struct{})
	go func() {
		r.Stop()
		close(stopped)
	}()
	time.Sleep(10 * time.Millisecond) // a Stop that does not wait ends here
	select {
	case <-stopped:
		t.Fatal("Stop returned while a waiter pops")
	default:
	}
	r.Fail()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return after the popping waiter left")
	}
	if r.TryTake() || takeOrNeed(r) || r.State() != Stopped {
		t.Fatalf("a waiter took the role after Stop, or it is %d", r.State())
	}
}

package smc

import "testing"

// TestPopRole: a waiter takes the port's role when nobody pops and keeps
// it lent when it leaves; a second waiter waits for a signal, and the
// first one leaving then hands the role to the serving goroutine at once,
// which otherwise takes a lent or free role back only after lendFor.
func TestPopRole(t *testing.T) {
	r := &popRole{wake: make(chan struct{}, 1)}
	if !r.takeForWait() {
		t.Fatal("a waiter did not take the free role")
	}
	if r.takeForWait() {
		t.Fatal("a second waiter took the role a reader holds")
	}
	if ok, _ := r.takeForServe(); ok {
		t.Fatal("the serving goroutine took the role a reader holds")
	}
	r.lend()
	select {
	case <-r.wake:
	default:
		t.Fatal("a reader leaving with another waiting did not wake the serving goroutine")
	}
	if ok, _ := r.takeForServe(); !ok {
		t.Fatal("the serving goroutine did not take the role a waiter needs")
	}
	r.doneWaiting()
	if !r.leaveServe() {
		t.Fatal("the serving goroutine kept the role with nobody waiting")
	}
	if ok, wait := r.takeForServe(); ok || wait <= 0 || wait > lendFor {
		t.Fatalf("the serving goroutine took the role it just left (%v) or waits %v", ok, wait)
	}
	if !r.takeForWait() {
		t.Fatal("a waiter did not take the role the serving goroutine left")
	}
	r.lend()
	select {
	case <-r.wake:
		t.Fatal("a reader leaving alone woke the serving goroutine")
	default:
	}
	if ok, _ := r.takeForServe(); ok {
		t.Fatal("the serving goroutine took a role just lent")
	}
	r.since = r.since.Add(-lendFor)
	if ok, _ := r.takeForServe(); !ok {
		t.Fatal("the serving goroutine did not take a role lent for lendFor")
	}
	if r.takeForWait() {
		t.Fatal("a waiter took the role the serving goroutine holds")
	}
	if r.leaveServe() {
		t.Fatal("the serving goroutine left the role with a waiter waiting for its signal")
	}
}

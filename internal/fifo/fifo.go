// Package fifo holds a first-in first-out queue in a slice that keeps its
// array, for hot paths that must not allocate per item.
package fifo

// FIFO is a queue in a slice that keeps its array: a pop moves the head,
// and a push that finds no room left at the end moves the items down to
// the front first, so a queue whose length stays bounded (a port's
// receive buffers, popped and posted again one by one) stops allocating.
// It moves them only once at least as many were popped as are left, and
// lets the array grow otherwise: each item then moves at most once per
// item popped, where moving on every push that finds the end reached
// moved the whole queue per push once the array was full (a port keeping
// 16 buffers posted copied 15 of them per message). The array stays
// within about four times the longest the queue has been.
// The zero value is an empty queue.
type FIFO[T any] struct {
	s    []T
	head int
}

// Len is the number of queued items.
func (f *FIFO[T]) Len() int { return len(f.s) - f.head }

// Items are the queued items, oldest first; valid until the next change.
func (f *FIFO[T]) Items() []T { return f.s[f.head:] }

// Push queues v, newest last.
func (f *FIFO[T]) Push(v ...T) {
	if f.head > 0 && len(f.s)+len(v) > cap(f.s) && f.head >= f.Len() {
		n := copy(f.s, f.s[f.head:])
		clear(f.s[n:])
		f.s, f.head = f.s[:n], 0
	}
	if len(v) == 1 {
		// One item (a message's buffer posted back) is a store: append
		// of a slice of a type with pointers calls typedslicecopy.
		f.s = append(f.s, v[0])
		return
	}
	f.s = append(f.s, v...)
}

// Drop removes the n oldest items.
func (f *FIFO[T]) Drop(n int) {
	// They hold no memory once gone. One item is cleared by a store:
	// clear of a type with pointers calls memclrHasPointers.
	if n == 1 {
		var zero T
		f.s[f.head] = zero
	} else {
		clear(f.s[f.head : f.head+n])
	}
	f.head += n
	if f.head == len(f.s) {
		f.s, f.head = f.s[:0], 0
	}
}

// Truncate keeps the n oldest items.
func (f *FIFO[T]) Truncate(n int) {
	clear(f.s[f.head+n:])
	f.s = f.s[:f.head+n]
	if n == 0 {
		f.s, f.head = f.s[:0], 0
	}
}

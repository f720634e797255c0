package lite_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/lite"
)

// Node 2 mallocs a read-only LMR and names it; node 1 maps it by name and
// reads it through an opaque handle, never seeing an rkey.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	master, _ := lite.Open(ctx, core.Embed(c.Node(2)), lite.Options{})
	defer master.Close()
	mapper, _ := lite.Open(ctx, core.Embed(c.Node(1)), lite.Options{})
	defer mapper.Close()

	l, _ := master.Malloc(ctx, "greeting", 4096, lite.Read)
	copy(l.Bytes(), "hello from node 2")

	h, _ := mapper.Map(ctx, 2, "greeting", lite.Read)
	buf := make([]byte, 17)
	err = mapper.Read(ctx, h, 0, buf)
	fmt.Println(string(buf), err)

	_, err = mapper.Map(ctx, 2, "greeting", lite.Write)
	fmt.Println(errors.Is(err, lite.ErrPerm))
	// Output:
	// hello from node 2 <nil>
	// true
}

// Node 2 makes a lock; node 1 opens it by name. Lock and Unlock run with
// one-sided atomics at node 2, whose CPU takes no part.
func ExampleLock() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	master, _ := lite.Open(ctx, core.Embed(c.Node(2)), lite.Options{})
	defer master.Close()
	user, _ := lite.Open(ctx, core.Embed(c.Node(1)), lite.Options{})
	defer user.Close()

	mine, _ := master.NewLock(ctx, "accounts", lite.Lease(time.Second))
	theirs, _ := user.OpenLock(ctx, 2, "accounts")

	fmt.Println(theirs.Lock(ctx))
	// ... update the state the lock guards ...
	fmt.Println(theirs.Unlock(ctx))
	fmt.Println(mine.Lock(ctx))
	fmt.Println(mine.Unlock(ctx))
	// Output:
	// <nil>
	// <nil>
	// <nil>
	// <nil>
}

// Four workers, two on each node, meet at a barrier mastered by node 2
// after each phase of their work.
func ExampleNode_Barrier() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	n2, _ := lite.Open(ctx, core.Embed(c.Node(2)), lite.Options{})
	defer n2.Close()
	n1, _ := lite.Open(ctx, core.Embed(c.Node(1)), lite.Options{})
	defer n1.Close()

	errs := make(chan error, 4)
	for _, n := range []*lite.Node{n1, n1, n2, n2} {
		go func() {
			// ... phase 1 ...
			err := n.Barrier(ctx, 2, "phase", 4)
			// ... phase 2, which needs everyone's phase 1 ...
			errs <- err
		}()
	}
	for range 4 {
		fmt.Println(<-errs)
	}
	// Output:
	// <nil>
	// <nil>
	// <nil>
	// <nil>
}

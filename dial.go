package krcore

import (
	"context"
	"errors"
	"fmt"
)

// QueueDialer is an API that makes a queue connected to a node and learns
// a region in one step: client.Client, in one round trip to krcored.
type QueueDialer interface {
	QueueTo(ctx context.Context, node NodeID, opts *ConnectOptions, name string) (VQ, Region, error)
}

// QueueTo makes a queue of api connected to node and, if name is not
// empty, learns the region node exports under name as the new queue asks
// (VQ.Region); the region is nil without a name. An API that is a
// QueueDialer does it in one step; any other makes the queue (API.Queue)
// and then ConnectQueue. On an error no queue is left.
func QueueTo(ctx context.Context, api API, node NodeID, opts *ConnectOptions, name string) (VQ, Region, error) {
	if api == nil {
		return nil, nil, fmt.Errorf("krcore: queue to node %d: no API: %w", node, ErrInvalid)
	}
	if d, ok := api.(QueueDialer); ok {
		return d.QueueTo(ctx, node, opts, name)
	}
	q, err := api.Queue()
	if err != nil {
		return nil, nil, err
	}
	return ConnectQueue(ctx, q, node, opts, name)
}

// ConnectQueue connects q, a new queue, to node and, if name is not empty,
// learns the region node exports under name as q asks (VQ.Region); the
// region is nil without a name. On an error it closes q.
func ConnectQueue(ctx context.Context, q VQ, node NodeID, opts *ConnectOptions, name string) (_ VQ, _ Region, err error) {
	if q == nil {
		return nil, nil, fmt.Errorf("krcore: connect queue to node %d: no queue: %w", node, ErrInvalid)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, q.Close())
		}
	}()
	if err := q.Connect(ctx, node, opts); err != nil {
		return nil, nil, err
	}
	if name == "" {
		return q, nil, nil
	}
	g, err := q.Region(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	return q, g, nil
}

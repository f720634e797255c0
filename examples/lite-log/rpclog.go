package main

import (
	"context"
	"errors"
	"net"
	"net/rpc"
	"sync"

	"github.com/krcore/krcore/internal/liteapp"
)

// rpcLog is the log over Go net/rpc on TCP: the coordinator keeps it and
// serves Log.Append; an appender calls it. This file is the whole of the
// log's net/rpc code, the counterpart of liteLog.
type rpcLog struct {
	ln  net.Listener // the coordinator's
	log *Log
	c   *rpc.Client // an appender's
}

// Log is the log the coordinator serves.
type Log struct {
	mu   sync.Mutex
	buf  []byte
	size int
}

// errFull: the log has no room for the record.
var errFull = errors.New("log full")

// Append adds rec at the log's tail and returns where it went.
func (l *Log) Append(rec []byte, off *int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf)+len(rec) > l.size {
		return errFull
	}
	*off = len(l.buf)
	l.buf = append(l.buf, rec...)
	return nil
}

// newRPCLog makes the log, of capacity bytes, and serves it.
func newRPCLog(capacity int) (*rpcLog, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g := &rpcLog{ln: ln, log: &Log{buf: make([]byte, 0, capacity), size: capacity}}
	srv := rpc.NewServer()
	if err := srv.Register(g.log); err != nil {
		ln.Close()
		return nil, err
	}
	go liteapp.ServeRPC(srv, ln) // until close closes ln
	return g, nil
}

// openRPCLog connects an appender to the log at addr.
func openRPCLog(addr string) (*rpcLog, error) {
	c, err := rpc.Dial("tcp", addr)
	return &rpcLog{c: c}, err
}

func (g *rpcLog) append(ctx context.Context, rec []byte) error {
	var off int
	select {
	case call := <-g.c.Go("Log.Append", rec, &off, nil).Done:
		return call.Error
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *rpcLog) contents() []byte {
	g.log.mu.Lock()
	defer g.log.mu.Unlock()
	return g.log.buf
}

func (g *rpcLog) close() error {
	if g.c != nil {
		return g.c.Close()
	}
	return g.ln.Close()
}

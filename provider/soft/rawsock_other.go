//go:build !linux

package soft

import (
	"errors"
	"net"
)

// rawSock is Linux's readv reader; elsewhere links use plain reads.
type rawSock struct{}

func newRawSock(net.Conn) *rawSock { return nil }

func (*rawSock) readv(a, b []byte) (int, error) { panic("soft: no raw socket reads on this system") }

var errAgain = errors.New("soft: no data")

func (*rawSock) session(func(uintptr) bool) error { panic("soft: no raw socket reads on this system") }

func (*rawSock) readFd(uintptr, []byte) (int, error) {
	panic("soft: no raw socket reads on this system")
}

// rawWriter writes the ordinary, waiting way here (see write.go).
type rawWriter struct{ conn net.Conn }

func newRawWriter(conn net.Conn) *rawWriter { return &rawWriter{conn: conn} }

func (w *rawWriter) tryWrite(bufs net.Buffers) (int, error) {
	b := bufs
	n, err := b.WriteTo(w.conn)
	return int(n), err
}

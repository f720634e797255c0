//go:build linux

package soft

import (
	"io"
	"net"
	"syscall"
	"unsafe"
)

// rawSock reads a TCP socket with readv, so a payload lands in registered
// memory and whatever follows it in the link's buffer, in one system call.
// Waiting for data stays with the runtime's poller (RawConn.Read).
type rawSock struct {
	rc   syscall.RawConn
	iov  [2]syscall.Iovec
	niov uintptr
	n    int
	err  error
	fn   func(fd uintptr) bool
}

func newRawSock(conn net.Conn) *rawSock {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	s := &rawSock{rc: rc}
	s.fn = s.try
	return s
}

// try is one readv; false asks the poller to wait for data.
func (s *rawSock) try(fd uintptr) bool {
	for {
		r, _, e := syscall.Syscall(syscall.SYS_READV, fd, uintptr(unsafe.Pointer(&s.iov[0])), s.niov)
		switch e {
		case 0:
			s.n, s.err = int(r), nil
			if r == 0 {
				s.err = io.EOF
			}
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		s.n, s.err = 0, e
		return true
	}
}

// errAgain is readFd finding no data.
var errAgain = syscall.EAGAIN

// session runs step with the socket until it reports true; step reports
// false to wait for data (see linkReader).
func (s *rawSock) session(step func(fd uintptr) bool) error { return s.rc.Read(step) }

// readFd is one read of fd into b: errAgain if there is no data, io.EOF at
// the end of the stream.
func (s *rawSock) readFd(fd uintptr, b []byte) (int, error) {
	for {
		n, err := syscall.Read(int(fd), b)
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			return 0, err
		case n == 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

// waitReadable waits until the socket has data, its end or an error,
// reading nothing.
func (s *rawSock) waitReadable() error { return s.rc.Read(peek) }

// peek reports whether a read of fd would not wait; false asks the poller
// to wait for data.
func peek(fd uintptr) bool {
	var b [1]byte
	for {
		_, _, e := syscall.Syscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
			syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		return true // data, the end or an error: the read that follows says which
	}
}

// readv reads into a, then b (which may be empty), waiting for data.
func (s *rawSock) readv(a, b []byte) (int, error) {
	s.iov[0] = syscall.Iovec{Base: unsafe.SliceData(a)}
	s.iov[0].SetLen(len(a))
	s.niov = 1
	if len(b) > 0 {
		s.iov[1] = syscall.Iovec{Base: unsafe.SliceData(b)}
		s.iov[1].SetLen(len(b))
		s.niov = 2
	}
	err := s.rc.Read(s.fn)
	s.iov = [2]syscall.Iovec{}
	if err != nil {
		return 0, err
	}
	return s.n, s.err
}

// rawWriter writes a TCP socket without waiting for it: one writev of
// whatever the socket takes now (see write.go). Connections without a
// file descriptor (tests' pipes) are written the ordinary, waiting way.
type rawWriter struct {
	conn net.Conn
	rc   syscall.RawConn
	iov  []syscall.Iovec
	n    int
	err  error
	fn   func(fd uintptr) bool
}

func newRawWriter(conn net.Conn) *rawWriter {
	w := &rawWriter{conn: conn}
	if sc, ok := conn.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			w.rc = rc
		}
	}
	w.fn = w.try
	return w
}

// maxIov bounds the segments of one writev (Linux's IOV_MAX).
const maxIov = 1024

// tryWrite writes a prefix of bufs, as long as the socket takes it, and
// reports its length.
func (w *rawWriter) tryWrite(bufs net.Buffers) (int, error) {
	if w.rc == nil {
		b := bufs // WriteTo consumes its receiver
		n, err := b.WriteTo(w.conn)
		return int(n), err
	}
	total := 0
	if len(bufs) > maxIov {
		bufs = append(net.Buffers(nil), bufs...) // skipBytes must not touch the caller's slices
	}
	for len(bufs) > 0 {
		w.iov = w.iov[:0]
		want := 0
		for _, b := range bufs {
			if len(w.iov) == maxIov {
				break
			}
			if len(b) > 0 {
				v := syscall.Iovec{Base: unsafe.SliceData(b)}
				v.SetLen(len(b))
				w.iov = append(w.iov, v)
				want += len(b)
			}
		}
		if want == 0 {
			break
		}
		if err := w.rc.Write(w.fn); err != nil {
			return total, err
		}
		clear(w.iov)
		if w.err != nil {
			return total, w.err
		}
		total += w.n
		if w.n < want {
			break // the socket is full
		}
		bufs = skipBytes(bufs, w.n)
	}
	return total, nil
}

// try is one writev; it never asks the poller to wait.
func (w *rawWriter) try(fd uintptr) bool {
	for {
		r, _, e := syscall.Syscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(unsafe.SliceData(w.iov))), uintptr(len(w.iov)))
		switch e {
		case 0:
			w.n, w.err = int(r), nil
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			w.n, w.err = 0, nil
		default:
			w.n, w.err = 0, e
		}
		return true
	}
}

// skipBytes drops the first n bytes of bufs, reslicing its elements.
func skipBytes(bufs net.Buffers, n int) net.Buffers {
	for n > 0 && len(bufs) > 0 {
		if n < len(bufs[0]) {
			bufs[0] = bufs[0][n:]
			return bufs
		}
		n -= len(bufs[0])
		bufs = bufs[1:]
	}
	return bufs
}

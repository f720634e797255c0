package smc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"github.com/krcore/krcore"
)

// dialTCP connects to addr over TCP. For a literal IP address it makes
// the socket itself and looks, right after the non-blocking connect,
// whether the kernel finished the handshake already (on loopback it has:
// the SYN-ACK is handled as connect returns). net.Dialer parks the
// dialing goroutine until the poller reports the socket writable, even
// then: a wake-up, which on a loaded machine of two cores cost as much
// as the connect itself (MEASUREMENTS.md, issue 17, session 17). A
// handshake still under way is waited for through the poller, within
// ctx. Host names, zoned addresses and a network that does not fit the
// address go to net.Dialer. The connection has net.Dialer's options
// (no delay, keep-alive at the default period: net.FileConn sets them).
func dialTCP(ctx context.Context, network, addr string) (*net.TCPConn, error) {
	ap, err := netip.ParseAddrPort(addr)
	ip := ap.Addr().Unmap()
	if err != nil || ap.Addr().Zone() != "" || !fitsNetwork(network, ip) || ctx.Err() != nil {
		return dialStd(ctx, network, addr)
	}
	raddr := net.TCPAddrFromAddrPort(netip.AddrPortFrom(ip, ap.Port()))
	fail := func(err error) error { return &net.OpError{Op: "dial", Net: network, Addr: raddr, Err: err} }
	family, sa := syscall.AF_INET6, syscall.Sockaddr(&syscall.SockaddrInet6{Port: int(ap.Port()), Addr: ip.As16()})
	if ip.Is4() {
		family, sa = syscall.AF_INET, &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ip.As4()}
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, syscall.IPPROTO_TCP)
	if err != nil {
		return nil, fail(os.NewSyscallError("socket", err))
	}
	if err := syscall.Connect(fd, sa); err != nil && err != syscall.EINPROGRESS && err != syscall.EINTR {
		syscall.Close(fd)
		return nil, fail(os.NewSyscallError("connect", err))
	}
	connected, err := connectDone(fd)
	if err != nil {
		syscall.Close(fd)
		return nil, fail(err)
	}
	f := os.NewFile(uintptr(fd), "")
	nc, err := net.FileConn(f) // a duplicate of fd, in the poller
	f.Close()
	if err != nil {
		return nil, fail(err)
	}
	tc := nc.(*net.TCPConn)
	if !connected {
		if err := awaitConnect(ctx, tc); err != nil {
			tc.Close()
			return nil, fail(err)
		}
	}
	return tc, nil
}

// dialStd is net.Dialer's dial.
func dialStd(ctx context.Context, network, addr string) (*net.TCPConn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		nc.Close()
		return nil, fmt.Errorf("smc: dial %s: not TCP: %w", network, krcore.ErrInvalid)
	}
	return tc, nil
}

// fitsNetwork reports whether ip may be dialled on network, as "tcp4"
// and "tcp6" restrict the family.
func fitsNetwork(network string, ip netip.Addr) bool {
	switch network {
	case "tcp":
		return true
	case "tcp4":
		return ip.Is4()
	case "tcp6":
		return ip.Is6()
	}
	return false
}

// connectDone reports whether the connect on socket fd finished: true
// once connected, false while under way, an error when it failed.
func connectDone(fd int) (bool, error) {
	e, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_ERROR)
	switch {
	case err != nil:
		return false, os.NewSyscallError("getsockopt", err)
	case e != 0:
		return false, os.NewSyscallError("connect", syscall.Errno(e))
	}
	switch _, err := syscall.Getpeername(fd); err {
	case nil:
		return true, nil
	case syscall.ENOTCONN, syscall.EINVAL:
		return false, nil
	default:
		return false, os.NewSyscallError("getpeername", err)
	}
}

// awaitConnect waits, within ctx, for tc's connect to finish: the poller
// reports the socket writable once it has, or failed.
func awaitConnect(ctx context.Context, tc *net.TCPConn) error {
	rc, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok {
		tc.SetWriteDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { tc.SetWriteDeadline(time.Unix(1, 0)) })
	var failed error
	werr := rc.Write(func(fd uintptr) bool {
		done, err := connectDone(int(fd))
		failed = err
		return done || err != nil
	})
	stop()
	tc.SetWriteDeadline(time.Time{})
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(werr, os.ErrDeadlineExceeded):
		return context.DeadlineExceeded // ctx's, whose own timer has not fired yet
	case werr != nil:
		return werr
	}
	return failed
}

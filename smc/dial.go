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

// dialTCP connects to addr over TCP with net.Dialer (its names, options,
// deadlines and errors), connecting each socket once before net.Dialer
// does (connectEarly).
func dialTCP(ctx context.Context, network, addr string) (*net.TCPConn, error) {
	d := net.Dialer{ControlContext: connectEarly}
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, ctxTimeout(ctx, err)
	}
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		nc.Close()
		return nil, fmt.Errorf("smc: dial %s: not TCP: %w", network, krcore.ErrInvalid)
	}
	return tc, nil
}

// ctxTimeout is err, a failed dial, with ctx's deadline as its cause when
// that passed: net.Dialer waits for a connect with ctx's deadline on the
// socket, which may fire before ctx's own timer, and then fails with the
// socket's i/o timeout, which is not context.DeadlineExceeded.
func ctxTimeout(ctx context.Context, err error) error {
	dl, ok := ctx.Deadline()
	var oe *net.OpError
	if ok && !time.Now().Before(dl) && errors.Is(err, os.ErrDeadlineExceeded) && errors.As(err, &oe) {
		oe.Err = context.DeadlineExceeded
	}
	return err
}

// connectEarly is net.Dialer's Control for dialTCP: it starts the connect
// of the socket net.Dialer made for address. net.Dialer's own connect
// then finds the socket connected where the kernel finished the handshake
// inside this one (loopback: the SYN-ACK is handled before connect
// returns), and takes EISCONN for done; where it did not (EALREADY), net.Dialer
// waits through the poller as always. Left to itself net.Dialer gets
// EINPROGRESS and parks the dialing goroutine until the poller reports the
// socket writable, even when it already is: a wake-up, which on a loaded
// machine of two cores cost as much as the connect itself (MEASUREMENTS.md,
// issue 17, sessions 17 and 19). An address it cannot put in a socket
// address (a zone) is left to net.Dialer's connect.
func connectEarly(_ context.Context, network, address string, rc syscall.RawConn) error {
	sa := sockaddr(network, address)
	if sa == nil {
		return nil
	}
	var err error
	if cerr := rc.Control(func(fd uintptr) { err = syscall.Connect(int(fd), sa) }); cerr != nil {
		return nil // net.Dialer's connect meets the same socket
	}
	switch err {
	case nil, syscall.EINPROGRESS, syscall.EINTR:
		return nil
	}
	return os.NewSyscallError("connect", err)
}

// sockaddr is address ("ip:port", as net.Dialer's Control gets it) as a
// socket address of network's family ("tcp4" or "tcp6", the socket's),
// or nil.
func sockaddr(network, address string) syscall.Sockaddr {
	ap, err := netip.ParseAddrPort(address)
	if err != nil || ap.Addr().Zone() != "" {
		return nil
	}
	ip := ap.Addr()
	switch {
	case network == "tcp4" && ip.Unmap().Is4():
		return &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ip.Unmap().As4()}
	case network == "tcp6":
		return &syscall.SockaddrInet6{Port: int(ap.Port()), Addr: ip.As16()}
	}
	return nil
}

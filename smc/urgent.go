package smc

import (
	"errors"
	"fmt"
	"net"
	"syscall"
)

// WriteUrgent sends b as urgent data, as TCP's send with MSG_OOB does: it
// follows every byte written before, the peer's ReadUrgent returns it,
// and the peer's reads skip it. Over SMC it is the byte before the
// producer cursor of a CDC message with RFC 7609's urgent flags (WRITEn
// without a notification, so that the byte and its flags arrive as one);
// over TCP it is the TCP connection's urgent byte. A later urgent byte
// replaces one not yet read, whose place in the stream then reads as data.
func (c *Conn) WriteUrgent(b byte) error {
	if err := c.awaitWrite(); err != nil {
		return c.opErr("write", err)
	}
	if c.hsErr != nil {
		return c.opErr("write", c.hsErr)
	}
	if !c.mode.SMC {
		return c.opErr("write", sendOOB(c.tcp, b))
	}
	c.wrMu.Lock()
	defer c.wrMu.Unlock()
	_, err := c.writeSMCAs([]byte{b}, true)
	return c.opErr("write", err)
}

// ReadUrgent returns the urgent byte the peer sent and this side has not
// read, without waiting: ok is false when there is none (as TCP's recv
// with MSG_OOB fails then), also before the connection knows its mode.
// A Read stops at the urgent byte's place (the mark) when it read bytes
// before it, as TCP's does: read the urgent byte there, since over TCP
// Linux drops it once reads pass the mark (over SMC it stays until read
// or replaced).
func (c *Conn) ReadUrgent() (b byte, ok bool, err error) {
	select {
	case <-c.rxReady:
	default:
		return 0, false, nil
	}
	if !c.mode.SMC {
		b, ok, err = recvOOB(c.tcp)
		return b, ok, c.opErr("read", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.urgValid {
		return 0, false, nil
	}
	c.urgValid = false
	return c.urgByte, true, nil
}

// postUrgent WRITEs b into the peer's ring without a notification and
// sends the CDC message that announces it with the urgent flags, under one
// qmu: no other CDC (a move's) comes between; wrMu held.
func (c *Conn) postUrgent(b byte) (int, error) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if _, err := c.postLocked([]byte{b}, false); err != nil {
		return 0, err
	}
	return 1, c.pushCDC(flagUrgPending|flagUrgPresent, 0)
}

// onUrgent is a CDC message's urgent byte, the one before stream position
// at, which only the message announces; c.mu held.
func (c *Conn) onUrgent(at uint64) {
	if at != c.prod+1 {
		if c.err == nil {
			c.err = fmt.Errorf("smc: urgent data at %d with %d bytes arrived: %w", at, c.prod, errAborted)
		}
		return
	}
	c.prod = at
	c.node.stats.received.Add(1)
	if over := c.overrun(); over > 0 {
		c.err = fmt.Errorf("smc: the peer wrote %d bytes past the window: %w", over, errAborted)
		return
	}
	size, start := c.writeRing()
	ring := c.ring
	if c.moved {
		ring = c.nextRing
	}
	c.urgByte, c.urgValid = ring[(at-1-start)%size], true
	c.urgMark, c.urgSkip = at-1, true
}

// sendOOB sends b as TCP urgent data.
func sendOOB(tc *net.TCPConn, b byte) error {
	rc, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Write(func(fd uintptr) bool {
		serr = syscall.Sendto(int(fd), []byte{b}, syscall.MSG_OOB, nil)
		return !errors.Is(serr, syscall.EAGAIN)
	})
	if err != nil {
		return err
	}
	return serr
}

// recvOOB reads TCP urgent data, without waiting.
func recvOOB(tc *net.TCPConn) (byte, bool, error) {
	rc, err := tc.SyscallConn()
	if err != nil {
		return 0, false, err
	}
	var buf [1]byte
	var n int
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		n, _, rerr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_OOB)
		return true
	})
	switch {
	case err != nil:
		return 0, false, err
	case errors.Is(rerr, syscall.EINVAL), errors.Is(rerr, syscall.EAGAIN):
		return 0, false, nil // none, or not arrived yet
	case rerr != nil:
		return 0, false, rerr
	}
	return buf[0], n == 1, nil
}

package smc

import (
	"io"
	"net"
)

// WriteTo writes what the connection reads to w until EOF or an error
// (io.WriterTo, which io.Copy prefers): over SMC it hands w the bytes in
// the receive buffer itself, a copy fewer than through io.Copy's buffer,
// and returns the consumer cursor as Read does; over TCP it is the TCP
// connection's, after the bytes read during detection.
func (c *Conn) WriteTo(w io.Writer) (int64, error) {
	c.rdMu.Lock()
	defer c.rdMu.Unlock()
	if err := c.readable(); err != nil {
		return 0, c.opErr("read", err)
	}
	if c.mode.SMC {
		n, err := c.writeToSMC(w)
		return n, c.opErr("read", err)
	}
	var total int64
	for len(c.pre) > 0 {
		k, err := w.Write(c.pre)
		c.pre = c.pre[k:]
		total += int64(k)
		if err != nil {
			return total, err
		}
	}
	n, err := c.tcp.WriteTo(w)
	return total + n, err
}

// ReadFrom writes what it reads from r until EOF or an error
// (io.ReaderFrom, which io.Copy uses when r has no WriteTo). Over TCP it
// is the TCP connection's, which splices from a TCP or Unix socket
// source. Over SMC it reads into a buffer of the peer's receive
// buffer's size (io.Copy's is 32 KiB) and Writes what each Read gave; in
// one process that measures as 32 KiB Writes do (BenchmarkCopyIn).
// Reading straight into the staging buffer would save a copy, but a Read
// that blocks would then keep the buffer from Close and Node.Close. An
// error of r comes back as it is.
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	if err := c.awaitWrite(); err != nil {
		return 0, c.opErr("readfrom", err)
	}
	if c.hsErr != nil {
		return 0, c.opErr("readfrom", c.hsErr)
	}
	if !c.mode.SMC {
		return c.tcp.ReadFrom(r)
	}
	c.mu.Lock()
	size := c.psize
	c.mu.Unlock()
	buf := make([]byte, size)
	var total int64
	for {
		k, rerr := r.Read(buf)
		if k > 0 {
			w, err := c.Write(buf[:k])
			total += int64(w)
			if err != nil {
				return total, err
			}
		}
		if rerr == io.EOF {
			return total, nil
		}
		if rerr != nil {
			return total, rerr
		}
	}
}

// writeToSMC is WriteTo over SMC; rdMu held. The ring's bytes between the
// consumer and producer cursors stay put until the cursor moves past
// them, and lent keeps the buffer from being released while w has them.
func (c *Conn) writeToSMC(w io.Writer) (int64, error) {
	var total int64
	for {
		c.mu.Lock()
		if c.localClosed { // the ring may be another connection's by now
			c.mu.Unlock()
			return total, net.ErrClosed
		}
		if c.prod > c.cons {
			chunk, old := c.chunk()
			if len(chunk) == 0 { // the urgent byte alone, skipped
				c.mu.Unlock()
				giveBack(old)
				continue
			}
			c.lent = true
			c.mu.Unlock()
			giveBack(old)
			k, werr := w.Write(chunk)
			c.mu.Lock()
			c.lent = false
			c.cons += uint64(k)
			update := c.wantUpdate()
			closing := c.localClosed
			c.mu.Unlock()
			if closing {
				// Only a Close meanwhile waits for lent: waking the
				// keeper after every chunk cost a wake-up per echoed
				// message, often of a thread.
				if c.endNow() != ended {
					c.nudge()
				}
			}
			total += int64(k)
			if update {
				c.sendCDC(0, 0) // a failure shows on the next call
			}
			if werr != nil {
				return total, werr
			}
			continue
		}
		err := c.err
		if c.peerDoneWriting {
			err = io.EOF
		}
		c.mu.Unlock()
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
		if err := c.waitRx(); err != nil {
			return total, err
		}
	}
}

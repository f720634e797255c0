package soft

import (
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krcore/krcore/verbs"
)

// TestReaderStopsBetweenLargeFrames: a goroutine reading a link for a CQ
// waiter gets back to its application between large frames once it is
// told to stop, though the peer keeps sending them. It used to read on for
// as long as they came (the next header is always read ahead with a large
// payload), so a receiver whose application had to post receives for the
// stream never got to: every SEND was NAKed RNR and resent, for good.
func TestReaderStopsBetweenLargeFrames(t *testing.T) {
	n, err := NewNode(Config{TCPOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	// The peer has sent 32 64 KiB WRITEs to a QP that does not exist (the
	// node drops them), all in the socket's buffers before anyone reads.
	const size, count = 64 << 10, 32
	msg := make([]byte, 4+headerLen+size)
	(&frame{typ: frameRequest, op: verbs.OpWrite, dstQPN: 1 << 23}).putHeader(msg, size)
	stream := make([]byte, 0, count*len(msg))
	for range count {
		stream = append(stream, msg...)
	}
	// The peer ends its stream after it, so the test can count what the
	// reader left to the end, however long a loaded machine takes.
	wrote := make(chan error, 1)
	go func() {
		peer.SetWriteDeadline(time.Now().Add(time.Minute))
		_, err := peer.Write(stream)
		if err == nil {
			err = peer.(*net.TCPConn).CloseWrite()
		}
		wrote <- err
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
		wrote = nil
	case <-time.After(time.Second):
		// The socket's buffers are smaller here, or the writer has yet
		// to run: the rest follows as the reader reads, which only
		// makes the stream longer.
	}

	l := newTCPLink(n, "peer")
	l.conn = conn
	rd := newLinkReader(l, conn)
	var asked atomic.Int32
	stop := func() bool { return asked.Add(1) > 1 } // read, then stop
	if err := rd.serve(stop, nil); err != nil {
		t.Fatal(err)
	}
	// Read what the reader left up to the stream's end. The deadline
	// only bounds a hang: a stall of the writer or of this goroutine is
	// no failure (a 100 ms deadline here failed 13 of 120 runs under load).
	conn.SetReadDeadline(time.Now().Add(time.Minute))
	rest := 0
	for buf := make([]byte, 1<<20); ; {
		k, err := conn.Read(buf)
		rest += k
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("reading the rest of the stream after %d bytes: %v", rest, err)
		}
	}
	if wrote != nil {
		if err := <-wrote; err != nil {
			t.Fatal(err)
		}
	}
	if rest < len(stream)/2 {
		t.Fatalf("the reader told to stop read %d of %d bytes of large frames before it did", len(stream)-rest, len(stream))
	}
}

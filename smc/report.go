package smc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/krcore/krcore"
)

// DefaultReportEvery is how often a Node through krcored reports its
// connections and counters to the daemon when NodeOptions.ReportEvery is 0.
const DefaultReportEvery = time.Second

// ReportName is the name under which a Node reports to krcored:
// "smc/" and its port, so that several Nodes of one process do not
// overwrite each other's reports.
func ReportName(port uint32) string { return "smc/" + strconv.FormatUint(uint64(port), 10) }

// maxReport bounds a report's JSON below what krcored accepts (48 KiB,
// wire.MaxReport): connections past it are left out and counted.
const maxReport = 40 << 10

// Report is what a Node tells krcored about itself (and what krctl smc
// reads back): its endpoint, counters and connections.
type Report struct {
	Node  krcore.NodeID `json:"node"`
	Port  uint32        `json:"port"`
	Stats Stats         `json:"stats"`
	Conns []ConnInfo    `json:"conns"`
	// Omitted counts connections left out so that the report fits a
	// message to the daemon.
	Omitted int `json:"conns_omitted,omitempty"`
}

// ConnInfo describes one connection of a Node as smcss lists it.
type ConnInfo struct {
	// State is INIT (handshake pending), ACTIVE, APPCLW (this side
	// closed its writing half), PEERCLW (the peer did), CLOSED (both), or
	// ABORTED (the peer died, an RDMA request failed or the handshake
	// broke).
	State   string `json:"state"`
	Role    string `json:"role"` // "client" (dialled) or "server" (accepted)
	Local   string `json:"local"`
	Foreign string `json:"foreign"`
	// Mode is "SMC", "TCP" or "pending"; Reason says why TCP, PeerReason
	// the peer's reason when it declined.
	Mode       string `json:"mode"`
	Reason     Reason `json:"reason,omitempty"`
	PeerReason Reason `json:"peer_reason,omitempty"`
	// Error is the error behind Reason (Mode.Err), if one failed here.
	Error string `json:"error,omitempty"`
	// The SMC side, zero over TCP: the tokens naming the connection at
	// each end, the peer's node, the receive buffer sizes (RMB: this
	// side's, which the peer writes; PeerRMB: the peer's, which this side
	// writes), and the cursors as wrap sequence and offset: Prod and Cons
	// of this side's receive buffer (what the peer wrote, what the
	// application read), Sent and PeerCons of the peer's (what this side
	// wrote, what the peer said it read).
	Token     uint32        `json:"token,omitempty"`
	PeerToken uint32        `json:"peer_token,omitempty"`
	PeerNode  krcore.NodeID `json:"peer_node,omitempty"`
	RMB       int           `json:"rmb,omitempty"`
	PeerRMB   int           `json:"peer_rmb,omitempty"`
	Prod      Cursor        `json:"prod"`
	Cons      Cursor        `json:"cons"`
	Sent      Cursor        `json:"sent"`
	PeerCons  Cursor        `json:"peer_cons"`
	// BytesReceived and BytesSent are the bytes read from and written
	// into the receive buffers (SMC only).
	BytesReceived uint64 `json:"bytes_received"`
	BytesSent     uint64 `json:"bytes_sent"`
}

// Cursor is a position in a receive buffer as RFC 7609 keeps it: how
// many times the ring wrapped, and the offset in it.
type Cursor struct {
	Wrap uint16 `json:"wrap"`
	Off  uint32 `json:"off"`
}

// String prints the cursor as smcss does, wrap:offset.
func (c Cursor) String() string { return fmt.Sprintf("%d:%d", c.Wrap, c.Off) }

// cursorOf is the cursor of a count of bytes in a ring of size bytes.
func cursorOf(count uint64, size int) Cursor {
	if size <= 0 {
		return Cursor{}
	}
	return Cursor{Wrap: uint16(count / uint64(size)), Off: uint32(count % uint64(size))}
}

// MarshalText writes the reason's code in hex, as Linux's smc tools print
// it ("0x03010000").
func (r Reason) MarshalText() ([]byte, error) {
	return []byte(fmt.Sprintf("%#08x", uint32(r))), nil
}

// UnmarshalText reads what MarshalText writes.
func (r *Reason) UnmarshalText(b []byte) error {
	v, err := strconv.ParseUint(string(b), 0, 32)
	if err != nil {
		return fmt.Errorf("smc: reason %q: %w", b, krcore.ErrInvalid)
	}
	*r = Reason(v)
	return nil
}

// Text is the reason's description alone ("peer did not indicate SMC"),
// or its code when it has none.
func (r Reason) Text() string {
	if s, ok := reasonText[r]; ok {
		return s
	}
	return fmt.Sprintf("%#08x", uint32(r))
}

// Conns lists the Node's connections (those Listen and Dial made with it
// and not yet closed), oldest first.
func (n *Node) Conns() []ConnInfo {
	n.mu.Lock()
	cs := make([]*Conn, 0, len(n.all))
	for c := range n.all {
		cs = append(cs, c)
	}
	sort.Slice(cs, func(i, j int) bool { return n.all[cs[i]] < n.all[cs[j]] })
	n.mu.Unlock()
	out := make([]ConnInfo, len(cs))
	for i, c := range cs {
		out[i] = c.info()
	}
	return out
}

// Report is the Node's report: its endpoint, counters and connections.
func (n *Node) Report() Report {
	return Report{Node: n.api.Node(), Port: n.port, Stats: n.Stats(), Conns: n.Conns()}
}

// track lists c among the Node's connections until untrack.
func (n *Node) track(c *Conn) {
	n.mu.Lock()
	n.serial++
	n.all[c] = n.serial
	n.mu.Unlock()
}

func (n *Node) untrack(c *Conn) {
	n.mu.Lock()
	delete(n.all, c)
	n.mu.Unlock()
}

// info describes c.
func (c *Conn) info() ConnInfo {
	m := c.Mode()
	ci := ConnInfo{Role: "client", Local: c.LocalAddr().String(), Foreign: c.RemoteAddr().String(),
		Mode: "SMC", Reason: m.Reason, PeerReason: m.Peer, State: "ACTIVE"}
	if c.server {
		ci.Role = "server"
	}
	switch {
	case m.Pending:
		ci.Mode, ci.State = "pending", "INIT"
		return ci
	case !m.SMC:
		ci.Mode = "TCP"
		if m.Err != nil {
			ci.Error = m.Err.Error()
		}
		if c.hsErr != nil {
			ci.State = "ABORTED"
		}
		return ci
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ci.Token, ci.PeerToken, ci.PeerNode = c.token, c.pToken, c.peerNode
	ci.RMB, ci.PeerRMB = len(c.ring), c.psize
	ci.Prod, ci.Cons = cursorOf(c.prod-c.base, len(c.ring)), cursorOf(c.cons-c.base, len(c.ring))
	ci.Sent, ci.PeerCons = cursorOf(c.sent-c.pbase, c.psize), cursorOf(max(c.peerCons, c.pbase)-c.pbase, c.psize)
	ci.BytesReceived, ci.BytesSent = c.cons, c.sent
	ci.State = c.stateLocked()
	return ci
}

// stateLocked names an SMC connection's state; c.mu held.
func (c *Conn) stateLocked() string {
	switch {
	case c.err != nil:
		return "ABORTED"
	case c.wrShut && (c.peerDoneWriting || c.peerClosed):
		return "CLOSED"
	case c.wrShut:
		return "APPCLW"
	case c.peerDoneWriting || c.peerClosed:
		return "PEERCLW"
	}
	return "ACTIVE"
}

// reporter is an API that passes reports to krcored (client.Client).
type reporter interface {
	Report(ctx context.Context, name string, body []byte) error
}

// report sends the Node's report to krcored every interval while it
// changes, until ctx ends; then it withdraws it. A failed send is tried
// again at the next tick: a report is a view, never worth failing over.
func (n *Node) report(ctx context.Context, r reporter, every time.Duration) {
	defer n.wg.Done()
	name := ReportName(n.port)
	t := time.NewTicker(every)
	defer t.Stop()
	var last []byte
	for {
		if b := n.reportJSON(); !bytes.Equal(b, last) {
			sctx, cancel := context.WithTimeout(ctx, every)
			if r.Report(sctx, name, b) == nil {
				last = b
			}
			cancel()
		}
		select {
		case <-ctx.Done():
			wctx, cancel := context.WithTimeout(context.Background(), every)
			r.Report(wctx, name, nil)
			cancel()
			return
		case <-t.C:
		}
	}
}

// reportJSON is the Node's report as JSON in at most maxReport bytes: the
// newest connections are left out (and counted) if it is larger.
func (n *Node) reportJSON() []byte {
	rep := n.Report()
	for {
		b, err := json.Marshal(rep)
		if err != nil || len(b) <= maxReport || len(rep.Conns) == 0 {
			return b
		}
		k := len(rep.Conns) / 2
		rep.Omitted += len(rep.Conns) - k
		rep.Conns = rep.Conns[:k:k]
	}
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/smc"
)

// smcNode is one process's SMC Node as krctl smc lists it: the client
// that reported it and its report (smc.Report).
type smcNode struct {
	Client uint64        `json:"client"`
	PID    int32         `json:"pid"`
	UID    uint32        `json:"uid"`
	Age    time.Duration `json:"age"` // since the Node reported
	// Error says why the report could not be read (any client may keep
	// a report under an smc name): the row stands for it, empty.
	Error string `json:"error,omitempty"`
	smc.Report
}

// fetchSMC reads the SMC Nodes' reports from the daemon; one that does
// not parse is listed with its error, not fatal: another client's report
// must not hide the rest.
func fetchSMC(ctx context.Context, sock string) ([]smcNode, error) {
	c, err := client.Attach(ctx, client.Options{Socket: sock})
	if err != nil {
		return nil, fmt.Errorf("attach to %s: %w", sock, err)
	}
	defer c.Close()
	reps, err := c.Reports(ctx, "smc/")
	if err != nil {
		return nil, err
	}
	nodes := []smcNode{}
	for _, r := range reps {
		n := smcNode{Client: r.Client, PID: r.PID, UID: r.UID, Age: r.Age}
		if err := json.Unmarshal(r.Body, &n.Report); err != nil {
			n.Report, n.Error = smc.Report{}, fmt.Sprintf("report %s: %v", r.Name, err)
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

// smcTables prints the connections as smcss does, then the counters as
// smcr-stats does: one row per Node and their total, and the fallbacks
// by reason over all of them.
func smcTables(w io.Writer, nodes []smcNode) {
	fmt.Fprintln(w, "PID\tPORT\tSTATE\tROLE\tLOCAL\tFOREIGN\tMODE\tREASON\tTOKEN\tRMB\tPEER_RMB\tPROD\tCONS\tSENT\tPEER_CONS")
	omitted := 0
	for _, n := range nodes {
		for _, c := range n.Conns {
			reason := "-"
			if c.Mode == "TCP" {
				reason = c.Reason.Text()
				if c.Reason == smc.ReasonPeerDeclined {
					reason += ": " + c.PeerReason.Text()
				}
			}
			fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.PID, n.Port, c.State, c.Role,
				c.Local, c.Foreign, c.Mode, reason, orDash(uint64(c.Token)), orDash(uint64(c.RMB)), orDash(uint64(c.PeerRMB)),
				c.Prod, c.Cons, c.Sent, c.PeerCons)
		}
		omitted += n.Omitted
	}
	if omitted > 0 {
		fmt.Fprintf(w, "(%d more connections left out: a Node's report did not fit a message)\n", omitted)
	}
	for _, n := range nodes {
		if n.Error != "" {
			fmt.Fprintf(w, "(client %d, pid %d: unreadable %s)\n", n.Client, n.PID, n.Error)
		}
	}
	fmt.Fprintln(w, "\nPID\tPORT\tSMC\tFALLBACKS\tBYTES_SENT\tBYTES_RECEIVED\tRDMA_WRITES\tCURSOR_MSGS\tSLABS\tMEMORY\tGROWS\tSHRINKS\tLOOKUPS\tDROPPED\tAGE")
	var total smc.Stats
	byReason := map[smc.Reason]uint64{}
	for _, n := range nodes {
		s := n.Stats
		fb := uint64(0)
		for r, k := range s.Fallbacks {
			fb += k
			byReason[r] += k
		}
		fmt.Fprintf(w, "%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", n.PID, n.Port, s.SMC, fb, s.BytesSent, s.BytesReceived,
			s.Writes, s.CursorMsgs, s.Slabs, s.Memory, s.Grows, s.Shrinks, s.Lookups, s.Dropped, n.Age.Round(time.Millisecond))
		total.SMC, total.BytesSent, total.BytesReceived = total.SMC+s.SMC, total.BytesSent+s.BytesSent, total.BytesReceived+s.BytesReceived
		total.Writes, total.CursorMsgs, total.Slabs = total.Writes+s.Writes, total.CursorMsgs+s.CursorMsgs, total.Slabs+s.Slabs
		total.Lookups, total.Dropped = total.Lookups+s.Lookups, total.Dropped+s.Dropped
		total.Memory, total.Grows, total.Shrinks = total.Memory+s.Memory, total.Grows+s.Grows, total.Shrinks+s.Shrinks
	}
	fb := uint64(0)
	for _, k := range byReason {
		fb += k
	}
	fmt.Fprintf(w, "total\t-\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t-\n", total.SMC, fb, total.BytesSent, total.BytesReceived,
		total.Writes, total.CursorMsgs, total.Slabs, total.Memory, total.Grows, total.Shrinks, total.Lookups, total.Dropped)
	fmt.Fprintln(w, "\nFALLBACK_REASON\tCODE\tCOUNT")
	for _, r := range slices.Sorted(maps.Keys(byReason)) {
		fmt.Fprintf(w, "%s\t%#08x\t%d\n", r.Text(), uint32(r), byReason[r])
	}
}

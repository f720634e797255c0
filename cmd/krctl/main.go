// Command krctl inspects a running krcored.
//
//	krctl [-socket PATH] [-json] status
//	krctl [-socket PATH] [-json] list clients|vqs|qps|meta|counters
//	krctl [-socket PATH] [-json] smc
//
// Tables are in the style of smcss; -json prints the daemon's status
// document (wire.Status) or the listed part of it.
//
// The daemon shows a user other than root and its own only that user's
// clients (list clients, vqs) and reports (smc); the other clients are
// counted in status's clients and in "clients_hidden".
//
// list qps prints one row per shared physical QP of the node (the DC
// target, the DC initiators, the RC QPs, those entering or leaving the
// pool included): its type, number, peer node and the peer's QP (RC
// only), the state the runtime tracks (ready, connecting, draining,
// closing, recovering, error), the VQs whose requests go to it, and its
// requests in flight, queued, and posted since it was created:
//
//	TYPE  QPN      PEER  RQPN     STATE  VQS  INFLIGHT  QUEUED  POSTED
//	dct   1298346  -     -        ready  0    0         0       0
//	dci   2275018  -     -        ready  1    0         0       1
//	dci   7124377  -     -        ready  0    0         0       0
//	rc    5533911  2     3815021  ready  3    1         0       18211
//
// With -json it prints the rows ([]wire.QPStatus, core.PoolQP's fields); the counts by type are in
// the status document's "pool".
//
// list meta prints the MetaServers the node reads from, in the order it
// tries them, with where their records come from ("embedded": the
// MetaServers keep them; "etcd ENDPOINTS PREFIX": they mirror etcd, see
// krcored -etcd), then the meta cache's counters, then one row per cached
// record: the node, its address, DC target (0: none, RC only), control QP,
// the MetaServer's version of the record and how long ago this version
// was cached:
//
//	METASERVER                                SOURCE
//	addr=10.0.0.1:7000 qpn=17 qkey=0x5b8c666c  etcd 10.0.0.9:2379 /krcore/
//
//	HITS  MISSES  READS  TORN  FAILOVERS
//	5     1       1      0     0
//
//	NODE  ADDR            DCT      CTRL_QPN  VERSION  AGE
//	2     127.0.0.1:7471  6003417  8400185   2        1.204s
//
// With -json it prints one object: the counters (as meta.ClientStats) and
// "entries" ([]meta.CacheEntry).
//
// smc lists the SMC sockets (package smc) of every process attached to the
// daemon, as Linux's smcss does, from the reports their Nodes send (see
// smc's doc, "Tools"): state, role, addresses, mode with the fallback
// reason, token, receive buffer sizes, cursors (wrap:offset; PROD and
// CONS of the connection's receive buffer, SENT and PEER_CONS of the
// peer's); then the counters per Node and in total, as smcr-stats does,
// with each report's age; then the fallbacks by reason:
//
//	PID   PORT        STATE    ROLE    LOCAL            FOREIGN          MODE  REASON                     TOKEN       RMB   PEER_RMB  PROD    CONS    SENT  PEER_CONS
//	8921  1397591074  PEERCLW  server  127.0.0.1:45051  127.0.0.1:58498  SMC   -                          3053750500  4096  4096      2:1808  2:1808  0:0   0:0
//	8921  1397591074  ACTIVE   server  127.0.0.1:45051  127.0.0.1:58506  TCP   peer did not indicate SMC  -           -     -         0:0     0:0     0:0   0:0
//
//	PID    PORT        SMC  FALLBACKS  BYTES_SENT  BYTES_RECEIVED  RDMA_WRITES  CURSOR_MSGS  SLABS  MEMORY  GROWS  SHRINKS  LOOKUPS  DROPPED  AGE
//	8921   1397591074  1    1          0           10000           0            8            1      139264  0      0        1        0        8ms
//	total  -           1    1          0           10000           0            8            1      139264  0      0        1        0        -
//
//	FALLBACK_REASON            CODE        COUNT
//	peer did not indicate SMC  0x03010000  1
//
// With -json it prints one object per Node: its client, pid, uid, the
// report's age and the report (smc.Report).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/meta"
)

// errUsage reports a command line krctl does not understand.
var errUsage = errors.New("usage: krctl [-socket PATH] [-json] status | smc | list clients|vqs|qps|meta|counters")

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err := run(ctx, os.Args[1:], os.Stdout)
	cancel()
	switch {
	case errors.Is(err, flag.ErrHelp): // -h: the flag package printed the usage
	case err != nil:
		fmt.Fprintln(os.Stderr, "krctl:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, w io.Writer) error {
	fs := flag.NewFlagSet("krctl", flag.ContinueOnError)
	sock := fs.String("socket", wire.DefaultSocket(), "krcored's socket")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	what, err := subject(fs.Args())
	if err != nil {
		return err
	}
	if *sock == "" {
		return fmt.Errorf("-socket: empty path (leave the flag out for %s)", wire.DefaultSocket())
	}
	if what == "smc" {
		return runSMC(ctx, *sock, *asJSON, w)
	}
	st, err := fetch(ctx, *sock)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(part(st, what))
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	table(tw, st, what)
	return tw.Flush()
}

// runSMC prints the SMC Nodes' connections and counters.
func runSMC(ctx context.Context, sock string, asJSON bool, w io.Writer) error {
	nodes, err := fetchSMC(ctx, sock)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(nodes)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	smcTables(tw, nodes)
	return tw.Flush()
}

// subject is what the command line asks for: status or a list.
func subject(args []string) (string, error) {
	switch {
	case len(args) == 1 && (args[0] == "status" || args[0] == "smc"):
		return args[0], nil
	case len(args) == 2 && args[0] == "list":
		switch args[1] {
		case "clients", "vqs", "qps", "meta", "counters":
			return args[1], nil
		}
	}
	return "", errUsage
}

func fetch(ctx context.Context, sock string) (*wire.Status, error) {
	c, err := client.Attach(ctx, client.Options{Socket: sock})
	if err != nil {
		return nil, fmt.Errorf("attach to %s: %w", sock, err)
	}
	defer c.Close()
	b, err := c.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	var st wire.Status
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	return &st, nil
}

// part is the piece of the status a command prints as JSON.
func part(st *wire.Status, what string) any {
	switch what {
	case "clients":
		return st.Clients
	case "vqs":
		return vqRows(st)
	case "qps":
		return st.QPs
	case "meta":
		return metaList{st.Meta, st.MetaServers, st.MetaSource, st.MetaEntries, st.MetaOmitted}
	case "counters":
		return st.Runtime
	}
	return st
}

// metaList is the meta cache as list meta -json prints it: the counters
// (at the top level, as list meta printed them alone) and the entries.
type metaList struct {
	meta.ClientStats
	Servers []string          `json:"meta_servers"` // the MetaServers read, in order
	Source  string            `json:"meta_source"`  // where their records come from
	Entries []meta.CacheEntry `json:"entries"`
	Omitted int               `json:"omitted,omitempty"` // entries the daemon left out of its status
}

// vqRow is a VQ with its client, for listing.
type vqRow struct {
	Client uint64 `json:"client"`
	PID    int32  `json:"pid"`
	wire.VQStatus
}

func vqRows(st *wire.Status) []vqRow {
	rows := []vqRow{}
	for _, c := range st.Clients {
		for _, v := range c.VQs {
			rows = append(rows, vqRow{Client: c.ID, PID: c.PID, VQStatus: v})
		}
	}
	return rows
}

// orDash prints n, or - for 0 (none).
func orDash(n uint64) string {
	if n == 0 {
		return "-"
	}
	return strconv.FormatUint(n, 10)
}

// address names a cached node's port: its fabric address, else its GID or
// LID.
func address(e meta.CacheEntry) string {
	switch {
	case e.Addr != "":
		return e.Addr
	case e.GID != "":
		return e.GID
	case e.LID != 0:
		return fmt.Sprintf("lid %d", e.LID)
	}
	return "-"
}

func table(w io.Writer, st *wire.Status, what string) {
	switch what {
	case "status":
		fmt.Fprintf(w, "node\t%d\nsocket\t%s\nuptime\t%s\nclients\t%d\nvqs\t%d\ndcis\t%d\nrc qps\t%d\nmeta cache\t%d\nconnects\t%d\nrefusals\t%d\nrecoveries\t%d\n",
			st.Node, st.Socket, st.Uptime, len(st.Clients)+st.ClientsHidden, st.Runtime.VQs, st.Runtime.DCIs, st.Runtime.RCs,
			len(st.MetaEntries)+st.MetaOmitted, st.Runtime.Connects, st.Runtime.Refusals, st.Runtime.Recoveries)
	case "clients":
		fmt.Fprintln(w, "ID\tPID\tUID\tGID\tVQS\tMRS\tMR_BYTES\tREGIONS\tPUSHES\tCOMPLETIONS\tREFUSALS\tNAPS\tEXPORTS")
		for _, c := range st.Clients {
			fmt.Fprintf(w, "%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", c.ID, c.PID, c.UID, c.GID, len(c.VQs), c.MRs,
				c.MRBytes, c.Regions, c.Pushes, c.Completions, c.Refusals, c.Naps, strings.Join(c.Exports, ","))
		}
		if st.ClientsHidden > 0 {
			fmt.Fprintf(w, "(%d clients of other users not shown)\n", st.ClientsHidden)
		}
	case "vqs":
		fmt.Fprintln(w, "CLIENT\tPID\tVQ\tNODE\tPORT\tOUTSTANDING")
		for _, r := range vqRows(st) {
			fmt.Fprintf(w, "%d\t%d\t%d\t%d\t%d\t%d\n", r.Client, r.PID, r.ID, r.Node, r.Port, r.Outstanding)
		}
	case "qps":
		fmt.Fprintln(w, "TYPE\tQPN\tPEER\tRQPN\tSTATE\tVQS\tINFLIGHT\tQUEUED\tPOSTED")
		for _, p := range st.QPs {
			fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%d\t%d\t%d\t%d\n", p.Type, p.QPN, orDash(p.Peer), orDash(uint64(p.RemoteQPN)),
				p.State, p.VQs, p.InFlight, p.Queued, p.Posted)
		}
		if st.QPsOmitted > 0 {
			fmt.Fprintf(w, "(%d more QPs left out: the status did not fit a message)\n", st.QPsOmitted)
		}
	case "meta":
		m := st.Meta
		fmt.Fprintln(w, "METASERVER\tSOURCE")
		for _, srv := range st.MetaServers {
			fmt.Fprintf(w, "%s\t%s\n", srv, st.MetaSource)
		}
		fmt.Fprintf(w, "\nHITS\tMISSES\tREADS\tTORN\tFAILOVERS\n%d\t%d\t%d\t%d\t%d\n", m.Hits, m.Misses, m.Reads, m.TornReads, m.Failovers)
		fmt.Fprintln(w, "\nNODE\tADDR\tDCT\tCTRL_QPN\tVERSION\tAGE")
		for _, e := range st.MetaEntries {
			fmt.Fprintf(w, "%d\t%s\t%d\t%d\t%d\t%s\n", e.Node, address(e), e.DCTNum, e.CtrlQPN, e.Version, e.Age.Round(time.Millisecond))
		}
		if st.MetaOmitted > 0 {
			fmt.Fprintf(w, "(%d more entries left out: the status did not fit a message)\n", st.MetaOmitted)
		}
	case "counters":
		r := st.Runtime
		for _, kv := range []struct {
			k string
			v uint64
		}{{"connects", r.Connects}, {"cold_connects", r.ColdConnects}, {"refusals", r.Refusals},
			{"recoveries", r.Recoveries}, {"post_errors", r.PostErrors}, {"rc_built", r.RCBuilt},
			{"rc_evicted", r.RCEvicted}, {"migrations", r.Migrations}, {"stale_targets", r.StaleTargets},
			{"dropped", r.Dropped}, {"clients_attached", st.Attached}, {"clients_reclaimed", st.Reclaim},
			{"clients_denied", st.Denied}} {
			fmt.Fprintf(w, "%s\t%d\n", kv.k, kv.v)
		}
	}
}

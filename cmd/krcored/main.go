// Command krcored is the node's KRCore daemon: it owns the RNIC and the
// runtime and serves every process on the node (package client) over a Unix
// socket and shared memory.
//
//	krcored [-config FILE] [-socket PATH] [-group NAME] [-node N] [-listen ADDR]
//	        [-provider soft|ibverbs] [-ib-dev NAME] [-ib-port N] [-gid-idx N]
//	        [-meta "addr=HOST:PORT qpn=N qkey=N"]... [-meta-buckets N] [-meta-slots N]
//	        [-etcd ENDPOINTS [-etcd-prefix P]]
//	        [-metrics ADDR [-pprof]] [-log-level info]
//	        [-spin D] [-share-quantum D] [-call-timeout D] [-send-timeout D] [-client-credits N]
//	        [-max-vqs N] [-max-mr-bytes N]
//
// The device is a soft RNIC by default: reachable by other hosts over TCP
// with -listen, in-memory otherwise. -provider ibverbs opens a real RDMA
// device through libibverbs instead (a binary built with -tags rdma: Linux,
// cgo, libibverbs-dev): -ib-dev names it (default the first), -ib-port its
// port, -gid-idx the GID its endpoints carry (default -1: a RoCE v2
// IPv4-mapped GID if there is one). The provider has no DC (mlx5dv is not
// bound; rxe has none), so the runtime runs in its RC-only mode: every VQ
// travels on a pooled RC QP to its peer. A build without the tag exits with
// the provider's "built without rdma support" error.
//
// -metrics serves Prometheus metrics over HTTP at ADDR/metrics: the
// node's and each attached client's counters, latency histograms of
// Connects and of requests (by opcode and size, and by client), and the
// process's and Go runtime's metrics; each client's series carry its pid
// and uid, which OpStatus shows other users only as counts, so ADDR is for
// operators. -pprof adds the Go profiles at
// ADDR/debug/pprof/ (net/http/pprof); it is off by default, since they show
// the daemon's memory and command line to whoever reaches ADDR.
//
// Without -meta the daemon embeds the MetaServer and logs its address for
// other nodes' -meta. -meta may be repeated: the runtime registers with
// every MetaServer listed and a Connect fails over between them.
// -meta-buckets and -meta-slots size the embedded MetaServer's table
// (default 1,024 x 4, which fills around a thousand nodes; for N nodes a
// power of two of at least 2N buckets of 8 slots, as meta.TableFor picks):
// buckets 1 to 1,048,576, slots 1 to 16; refused beside -meta.
//
// -etcd ENDPOINTS (comma-separated) keeps the cluster's membership in etcd
// (package meta/etcdstore): the node registers its record there under a
// lease it keeps alive, and its MetaServers mirror etcd instead of taking
// registrations. Without -meta every such daemon embeds a MetaServer that
// mirrors etcd and announces itself there, and reads from its own first,
// then from the other announced ones; with -meta the listed MetaServers
// must mirror the same etcd prefix (-etcd-prefix). The log's meta_source
// says where the MetaServer's records come from ("embedded" or the etcd).
//
// The config file is one JSON object with the flags' names as keys, dashes
// written as underscores ("socket", "group", "node", "listen", "provider",
// "ib_dev", "ib_port", "gid_idx", "meta", "meta_buckets", "meta_slots", "etcd", "etcd_prefix", "metrics", "pprof", "log_level", "spin",
// "share_quantum", "call_timeout", "send_timeout", "client_credits", "max_vqs",
// "max_mr_bytes"), plus "allow_uids" and "allow_gids" (lists of ids); flags
// given on the command line override it. "meta" is a list of MetaServers
// (or one string). Durations are Go duration strings as the flags take
// ("10us", "5s"); an integer is read as nanoseconds. An unknown key (keys
// are spelled exactly, case included), a key given twice or null, a file
// that is not one JSON object or not a regular file of at most 1 MiB, an
// argument that is not a flag, a value of the wrong type and a value out of
// range (from the file or a flag) are refused with the key and the reason: node, ib_port, client_credits,
// max_vqs, max_mr_bytes, call_timeout and send_timeout must be at least 1, gid_idx at
// least -1, spin at least 0; share_quantum takes any duration (negative:
// pacing off).
// SIGINT or SIGTERM shuts down gracefully: clients get OpBye and fail with
// krcore.ErrDaemonGone.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	httppprof "net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/verbs"
)

func main() {
	err := run(context.Background(), os.Args[1:])
	switch {
	case errors.Is(err, flag.ErrHelp): // -h: the flag package printed the usage
	case err != nil:
		fmt.Fprintln(os.Stderr, "krcored:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	cfg, err := parse(args)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	cfg.Logger = log
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	nc, err := cfg.node()
	if err != nil {
		return err
	}
	store, err := cfg.etcd()
	if err != nil {
		return err
	}
	if store != nil {
		defer store.Close() // after n.Close, which withdraws the node's record
		nc.Membership = store
	}
	startCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	n, err := daemon.Start(startCtx, nc)
	cancel()
	if err != nil {
		return err
	}
	defer n.Close()
	srv, rt := n.Server(), n.Runtime()
	log.Info("krcored serving", "socket", srv.Socket(), "node", cfg.Node, "device", cfg.describe(n.Device()),
		"rc_only", rt.Stats().RCOnly, "meta", rt.MetaInfo().String(), "meta_source", rt.MetaSource())
	if cfg.Metrics != "" {
		stopMetrics, err := serveMetrics(srv, cfg.Metrics, cfg.Pprof, log)
		if err != nil {
			return err
		}
		defer stopMetrics()
	}
	err = n.Serve(ctx)
	log.Info("krcored stopped", "err", err)
	return err
}

// describe names dev for the log: the soft RNIC's fabric address, or the
// device, port and GID peers reach an ibverbs device by.
func (cfg *config) describe(dev verbs.Device) string {
	p := dev.Port()
	if cfg.Provider == daemon.ProviderSoft {
		return "soft RNIC " + p.Addr
	}
	return fmt.Sprintf("%s port %d GID[%d] %s", dev.Name(), p.Num, p.GIDIndex, net.IP(p.GID[:]))
}

// serveMetrics serves /metrics, and /debug/pprof/ if pprof is set, until
// the returned stop is called.
func serveMetrics(srv *daemon.Server, addr string, pprof bool, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	hs := &http.Server{Handler: metricsMux(srv, pprof), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", "err", err)
		}
	}()
	log.Info("metrics", "addr", ln.Addr().String(), "pprof", pprof)
	return func() { hs.Close(); <-done }, nil
}

// metricsMux routes /metrics to the daemon's metrics and, with pprof,
// /debug/pprof/ to the Go runtime's profiles. The profiles are off by
// default: they show the daemon's memory and command line to whoever
// reaches the metrics address, and a CPU profile or trace costs the
// daemon while it runs.
func metricsMux(srv *daemon.Server, pprof bool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", srv.MetricsHandler())
	if pprof {
		mux.HandleFunc("/debug/pprof/", httppprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", httppprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", httppprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", httppprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", httppprof.Trace)
	}
	return mux
}

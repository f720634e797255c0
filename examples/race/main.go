// Command race is an elastic disaggregated key-value store on RACE
// hashing (ATC'21, package internal/racekv) under a load spike, as
// KRCore's paper evaluates it: memory nodes export the table, compute
// clients are processes that come and go and reach it with one-sided
// READ, WRITE, CAS and FETCH_ADD.
//
//	go run ./examples/race [-workload A] [-base 4] [-spike 8] [-keys 100000] [-warm 2s] [-after 3s] [-out DIR]
//
// The coordinator (this process) runs the memory nodes and starts the
// compute host's krcored as a process of its own. Base clients run a
// YCSB workload; then Spike new client processes start at once. Each
// mode runs the same scenario against the same table: raw (each client
// creates its own RNIC context and an RC QP per memory node, exchanging
// endpoints with it over TCP), embedded (each client runs its own krcore
// runtime and connects VQs through the MetaServer) and daemon (each
// client attaches to krcored and connects VQs through it). It reports
// each new client's time from process spawn to its first completed
// lookup, lookup latency and throughput over time (a CSV and a PNG in
// -out), then checks a recorded history of gets and puts, with clients
// killed in the middle of puts, for linearizability with porcupine.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/krcore/krcore/daemon"
)

func main() {
	runClient(time.Now()) // a client process: runs its job and exits
	runKrcored()          // the host's krcored: serves, then exits
	cfg := config{spike: spikeConfig{Bucket: 100 * time.Millisecond}, lin: linConfig{Timeout: time.Minute}}
	modes := flag.String("modes", "raw,embedded,daemon", "client kinds, in order: raw, embedded, daemon")
	flag.StringVar(&cfg.spike.Workload, "workload", "A", "YCSB workload: A (50% updates), B (5%), C (read only)")
	flag.IntVar(&cfg.spike.Base, "base", 4, "clients running before the spike")
	flag.IntVar(&cfg.spike.Spike, "spike", 8, "client processes started at once")
	flag.IntVar(&cfg.spike.Keys, "keys", 100000, "keys loaded")
	flag.IntVar(&cfg.spike.Value, "value", 64, "value bytes")
	flag.DurationVar(&cfg.spike.Warm, "warm", 2*time.Second, "time from the base clients' start to the spike")
	flag.DurationVar(&cfg.spike.After, "after", 3*time.Second, "time the clients run after the spike")
	flag.DurationVar(&cfg.spike.Bucket, "bucket", 100*time.Millisecond, "throughput sampling interval")
	flag.IntVar(&cfg.spike.Rounds, "rounds", 1, "scenario runs per mode, alternating the modes' order")
	flag.IntVar(&cfg.memNodes, "memnodes", 1, "memory nodes the table spans")
	flag.StringVar(&cfg.dir, "out", filepath.Join(os.TempDir(), "race"), "directory for the CSVs and the plot")
	flag.StringVar(&cfg.fabric.Device.Provider, "provider", daemon.ProviderSoft, "every process's RNIC: soft (a soft RNIC each, on loopback TCP) or ibverbs (a device context each; a binary built with -tags rdma)")
	flag.StringVar(&cfg.fabric.Device.IBDev, "ib-dev", "", "ibverbs: the device (empty: the first)")
	flag.IntVar(&cfg.fabric.Device.IBPort, "ib-port", 1, "ibverbs: the device's port")
	flag.IntVar(&cfg.fabric.Device.GIDIdx, "gid-idx", -1, "ibverbs: the GID index (-1: a RoCE v2 IPv4-mapped GID)")
	flag.DurationVar(&cfg.fabric.AckTimeout, "ack-timeout", 0, "every RC QP's ACK timeout per retry (0: the provider's)")
	flag.IntVar(&cfg.lin.Clients, "lin-clients", 4, "linearizability check: client processes per mode (0: no check)")
	flag.IntVar(&cfg.lin.Ops, "lin-ops", 300, "linearizability check: operations per client")
	flag.IntVar(&cfg.lin.Keys, "lin-keys", 3, "linearizability check: keys")
	flag.Parse()
	cfg.spike.Modes = strings.Split(*modes, ",")
	cfg.lin.Kills = 2
	if err := cfg.check(); err != nil {
		fmt.Fprintln(os.Stderr, "race:", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "race:", err)
		os.Exit(1)
	}
}

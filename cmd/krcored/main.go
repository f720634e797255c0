// Command krcored is the node's KRCore daemon: it owns the RNIC and the
// runtime and serves every process on the node (package client) over a Unix
// socket and shared memory.
//
//	krcored [-config FILE] [-socket PATH] [-group NAME] [-node N] [-listen ADDR]
//	        [-provider soft|ibverbs] [-ib-dev NAME] [-ib-port N] [-gid-idx N]
//	        [-meta "addr=HOST:PORT qpn=N qkey=N"] [-metrics ADDR] [-log-level info]
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
// Without -meta the daemon embeds the MetaServer and logs its address for
// other nodes' -meta. The config file is JSON with the flags' names as keys,
// dashes written as underscores ("socket", "group", "node", "listen",
// "provider", "ib_dev", "ib_port", "gid_idx", "meta", "metrics",
// "log_level", "spin", "client_credits", "share_quantum", "allow_uids",
// "allow_gids", "max_vqs", "max_mr_bytes"); flags given on the command line
// override it.
// SIGINT or SIGTERM shuts down gracefully: clients get OpBye and fail with
// client.ErrDaemonGone.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/provider/ibverbs"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// config is the daemon's configuration: file, then flags.
type config struct {
	daemon.Config
	Node     uint64 `json:"node"`
	Listen   string `json:"listen"`
	Provider string `json:"provider"`
	IBDev    string `json:"ib_dev"`
	IBPort   int    `json:"ib_port"`
	GIDIdx   int    `json:"gid_idx"`
	Meta     string `json:"meta"`
	Metrics  string `json:"metrics"`
	LogLevel string `json:"log_level"`
}

// Providers -provider accepts.
const (
	providerSoft    = "soft"
	providerIBVerbs = "ibverbs"
)

// newConfig is the configuration before the file and the flags: the file
// starts from it too, so a key it leaves out keeps the flag's default.
func newConfig() *config {
	return &config{Node: 1, LogLevel: "info", Provider: providerSoft, IBPort: 1, GIDIdx: -1}
}

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "krcored:", err)
		os.Exit(1)
	}
}

// parse reads the configuration (load) and checks it.
func parse(args []string) (*config, error) {
	cfg, err := load(args)
	if err != nil {
		return nil, err
	}
	return cfg, cfg.checkProvider()
}

// load reads the config file, if -config names one, and the flags over it.
func load(args []string) (*config, error) {
	cfg := newConfig()
	fs := flag.NewFlagSet("krcored", flag.ContinueOnError)
	file := fs.String("config", "", "JSON config file (flags override it)")
	fs.StringVar(&cfg.Socket, "socket", "", "Unix socket (default $XDG_RUNTIME_DIR/krcored.sock or /run/krcored.sock)")
	fs.StringVar(&cfg.Group, "group", "", "group owning the socket (mode 0660); its members may attach")
	fs.Uint64Var(&cfg.Node, "node", cfg.Node, "this node's cluster-wide id")
	fs.StringVar(&cfg.Listen, "listen", "", "soft RNIC TCP address for other hosts (empty: in-memory only)")
	fs.StringVar(&cfg.Provider, "provider", cfg.Provider, "RNIC: soft (the pure-Go soft RNIC) or ibverbs (a real device; needs -tags rdma)")
	fs.StringVar(&cfg.IBDev, "ib-dev", "", "ibverbs: RDMA `device` (default the first, as ibv_devices lists them)")
	fs.IntVar(&cfg.IBPort, "ib-port", cfg.IBPort, "ibverbs: device port")
	fs.IntVar(&cfg.GIDIdx, "gid-idx", cfg.GIDIdx, "ibverbs: GID table `index` (-1: a RoCE v2 IPv4-mapped GID if there is one)")
	fs.StringVar(&cfg.Meta, "meta", "", "remote MetaServer (\"addr=HOST:PORT qpn=N qkey=N\"); empty embeds one")
	fs.StringVar(&cfg.Metrics, "metrics", "", "HTTP address serving Prometheus metrics at /metrics (empty: off)")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	fs.DurationVar(&cfg.Spin, "spin", 0, "how long a client's pump polls its rings before it sleeps (0: the runtime's adaptive few microseconds)")
	fs.IntVar(&cfg.ClientCredits, "client-credits", 256, "requests one client may have in flight over all its VQs")
	fs.DurationVar(&cfg.ShareQuantum, "share-quantum", 0, "how long a client's pump may work without a break beside an interactive client before it naps three times as long (0: 50us on nodes of at most 4 CPUs, else off; negative: off)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if *file != "" {
		b, err := os.ReadFile(*file)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		fromFile := newConfig()
		if err := json.Unmarshal(b, fromFile); err != nil {
			return nil, fmt.Errorf("config %s: %w", *file, err)
		}
		// flags set on the command line win over the file
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		merge(fromFile, cfg, set)
		cfg = fromFile
	}
	return cfg, nil
}

// checkProvider refuses flags that do not fit the chosen provider, and
// -provider ibverbs in a build that cannot open a device.
func (cfg *config) checkProvider() error {
	switch cfg.Provider {
	case providerSoft:
		if cfg.IBDev != "" || cfg.IBPort != 1 || cfg.GIDIdx != -1 {
			return errors.New("-ib-dev, -ib-port and -gid-idx are for -provider ibverbs")
		}
		if cfg.Meta != "" && cfg.Listen == "" {
			// Without -listen the soft RNIC lives in this process's
			// memory, and joining fails only after the MetaServer's
			// retries time out.
			return errors.New("-meta on the soft RNIC needs -listen: an in-memory soft RNIC reaches no other process")
		}
		return nil
	case providerIBVerbs:
	default:
		return fmt.Errorf("-provider %q: want soft or ibverbs", cfg.Provider)
	}
	switch {
	case !ibverbs.Built:
		return fmt.Errorf("-provider ibverbs: %w", ibverbs.ErrNotBuilt)
	case cfg.Listen != "":
		return errors.New("-listen is the soft RNIC's; an ibverbs device has its own address")
	case cfg.IBPort < 1:
		return fmt.Errorf("-ib-port %d: ports count from 1", cfg.IBPort)
	case cfg.GIDIdx < -1:
		return fmt.Errorf("-gid-idx %d: want an index, or -1 to let the provider choose", cfg.GIDIdx)
	}
	return nil
}

// merge copies the flags set on the command line over the file's values.
func merge(dst, flags *config, set map[string]bool) {
	for name, copyFlag := range map[string]func(){
		"socket": func() { dst.Socket = flags.Socket }, "group": func() { dst.Group = flags.Group },
		"node": func() { dst.Node = flags.Node }, "listen": func() { dst.Listen = flags.Listen },
		"provider": func() { dst.Provider = flags.Provider }, "ib-dev": func() { dst.IBDev = flags.IBDev },
		"ib-port": func() { dst.IBPort = flags.IBPort }, "gid-idx": func() { dst.GIDIdx = flags.GIDIdx },
		"meta": func() { dst.Meta = flags.Meta }, "metrics": func() { dst.Metrics = flags.Metrics },
		"log-level": func() { dst.LogLevel = flags.LogLevel },
		"spin":      func() { dst.Spin = flags.Spin }, "client-credits": func() { dst.ClientCredits = flags.ClientCredits },
		"share-quantum": func() { dst.ShareQuantum = flags.ShareQuantum },
	} {
		if set[name] {
			copyFlag()
		}
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

	dev, err := openDevice(ctx, cfg)
	if err != nil {
		return err
	}
	defer dev.Close()
	// On a device without DC (every ibverbs device: mlx5dv is not bound)
	// core.New sets RC-only mode itself.
	rc := core.Config{Device: dev, Node: cfg.Node, Logger: log}
	if cfg.Meta != "" {
		info, err := meta.ParseInfo(cfg.Meta)
		if err != nil {
			return err
		}
		rc.Meta = []meta.Info{info}
	}
	startCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	rt, err := core.New(startCtx, rc)
	cancel()
	if err != nil {
		return err
	}
	defer rt.Close()
	srv, err := daemon.New(rt, cfg.Config)
	if err != nil {
		return err
	}
	log.Info("krcored serving", "socket", srv.Socket(), "node", cfg.Node, "device", cfg.describe(dev),
		"rc_only", rt.Stats().RCOnly, "meta", rt.MetaInfo().String())
	if cfg.Metrics != "" {
		stopMetrics, err := serveMetrics(srv, cfg.Metrics, log)
		if err != nil {
			srv.Close()
			return err
		}
		defer stopMetrics()
	}
	err = srv.Serve(ctx)
	log.Info("krcored stopped", "err", err)
	return err
}

// openDevice opens the RNIC cfg names: a soft node, or a device through
// libibverbs.
func openDevice(ctx context.Context, cfg *config) (verbs.Device, error) {
	if cfg.Provider == providerIBVerbs {
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		dev, err := ibverbs.Open(octx, cfg.IBDev, cfg.IBPort, cfg.GIDIdx)
		if err != nil {
			return nil, fmt.Errorf("open RDMA device %q port %d: %w", cfg.IBDev, cfg.IBPort, err)
		}
		return dev, nil
	}
	dev, err := soft.NewFabric().NewNode(soft.Config{Listen: cfg.Listen})
	if err != nil {
		return nil, fmt.Errorf("start soft RNIC: %w", err)
	}
	return dev, nil
}

// describe names dev for the log: the soft RNIC's fabric address, or the
// device, port and GID peers reach an ibverbs device by.
func (cfg *config) describe(dev verbs.Device) string {
	p := dev.Port()
	if cfg.Provider == providerSoft {
		return "soft RNIC " + p.Addr
	}
	return fmt.Sprintf("%s port %d GID[%d] %s", dev.Name(), p.Num, p.GIDIndex, net.IP(p.GID[:]))
}

// serveMetrics serves /metrics until the returned stop is called.
func serveMetrics(srv *daemon.Server, addr string, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		srv.WriteMetrics(w)
	})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", "err", err)
		}
	}()
	log.Info("metrics", "addr", ln.Addr().String())
	return func() { hs.Close(); <-done }, nil
}

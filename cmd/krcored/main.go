// Command krcored is the node's KRCore daemon: it owns the RNIC and the
// runtime and serves every process on the node (package client) over a Unix
// socket and shared memory.
//
//	krcored [-config FILE] [-socket PATH] [-group NAME] [-node N] [-listen ADDR]
//	        [-meta "addr=HOST:PORT qpn=N qkey=N"] [-metrics ADDR] [-log-level info]
//
// The device is a soft RNIC: reachable by other hosts over TCP with -listen,
// in-memory otherwise. Without -meta the daemon embeds the MetaServer and
// logs its address for other nodes' -meta. The config file is JSON with the
// flags' names as keys ("socket", "group", "node", "listen", "meta",
// "metrics", "allow_uids", "allow_gids", "max_vqs", "max_mr_bytes");
// flags given on the command line override it. SIGINT or SIGTERM shuts down
// gracefully: clients get OpBye and fail with client.ErrDaemonGone.
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
	"github.com/krcore/krcore/provider/soft"
)

// config is the daemon's configuration: file, then flags.
type config struct {
	daemon.Config
	Node     uint64 `json:"node"`
	Listen   string `json:"listen"`
	Meta     string `json:"meta"`
	Metrics  string `json:"metrics"`
	LogLevel string `json:"log_level"`
}

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "krcored:", err)
		os.Exit(1)
	}
}

func parse(args []string) (*config, error) {
	cfg := &config{Node: 1, LogLevel: "info"}
	fs := flag.NewFlagSet("krcored", flag.ContinueOnError)
	file := fs.String("config", "", "JSON config file (flags override it)")
	fs.StringVar(&cfg.Socket, "socket", "", "Unix socket (default $XDG_RUNTIME_DIR/krcored.sock or /run/krcored.sock)")
	fs.StringVar(&cfg.Group, "group", "", "group owning the socket (mode 0660); its members may attach")
	fs.Uint64Var(&cfg.Node, "node", 1, "this node's cluster-wide id")
	fs.StringVar(&cfg.Listen, "listen", "", "soft RNIC TCP address for other hosts (empty: in-memory only)")
	fs.StringVar(&cfg.Meta, "meta", "", "remote MetaServer (\"addr=HOST:PORT qpn=N qkey=N\"); empty embeds one")
	fs.StringVar(&cfg.Metrics, "metrics", "", "HTTP address serving Prometheus metrics at /metrics (empty: off)")
	fs.StringVar(&cfg.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&cfg.Spin, "spin", 0, "how long a client's pump polls its rings before it sleeps (0: the runtime's adaptive few microseconds)")
	fs.IntVar(&cfg.ClientCredits, "client-credits", 256, "requests one client may have in flight over all its VQs")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if *file != "" {
		b, err := os.ReadFile(*file)
		if err != nil {
			return nil, err
		}
		fromFile := &config{Node: 1, LogLevel: "info"}
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

// merge copies the flags set on the command line over the file's values.
func merge(dst, flags *config, set map[string]bool) {
	for name, copyFlag := range map[string]func(){
		"socket": func() { dst.Socket = flags.Socket }, "group": func() { dst.Group = flags.Group },
		"node": func() { dst.Node = flags.Node }, "listen": func() { dst.Listen = flags.Listen },
		"meta": func() { dst.Meta = flags.Meta }, "metrics": func() { dst.Metrics = flags.Metrics },
		"log-level": func() { dst.LogLevel = flags.LogLevel },
		"spin":      func() { dst.Spin = flags.Spin }, "client-credits": func() { dst.ClientCredits = flags.ClientCredits },
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

	dev, err := soft.NewFabric().NewNode(soft.Config{Listen: cfg.Listen})
	if err != nil {
		return err
	}
	defer dev.Close()
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
	log.Info("krcored serving", "socket", srv.Socket(), "node", cfg.Node, "fabric", dev.Port().Addr, "meta", rt.MetaInfo().String())
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

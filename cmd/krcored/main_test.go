package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/provider/ibverbs"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// TestRun starts krcored from a config file plus flags, attaches a client,
// scrapes the metrics and stops it as SIGTERM would (its context ends): the
// client then finds the daemon gone.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "krcored.sock")
	metrics := freeAddr(t)
	conf := filepath.Join(dir, "krcored.json")
	os.WriteFile(conf, []byte(`{"socket": "/nonexistent/overridden.sock", "node": 7, "max_vqs": 4, "log_level": "warn"}`), 0o600)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-config", conf, "-socket", sock, "-metrics", metrics}) }()
	defer func() { cancel(); <-done }()

	var c *client.Client
	var err error
	deadline := time.Now().Add(10 * time.Second)
	for c == nil {
		actx, acancel := context.WithTimeout(ctx, time.Second)
		c, err = client.Attach(actx, client.Options{Socket: sock})
		acancel()
		if err != nil && time.Now().After(deadline) {
			t.Fatal(err)
		}
		if err != nil {
			time.Sleep(10 * time.Millisecond) // the daemon is starting
		}
	}
	defer c.Close()
	if c.Node() != 7 {
		t.Errorf("node %d, want 7 from the config file", c.Node())
	}
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode %v %v, want 0660", fi.Mode(), err)
	}
	if code, body := get(t, metrics, "/metrics"); code != http.StatusOK || !strings.Contains(body, "krcored_clients 1") {
		t.Errorf("metrics: %d\n%s", code, body)
	}
	if code, _ := get(t, metrics, "/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without -pprof: %d, want 404", code)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
	done <- nil
	if _, err := c.Queue(); !errors.Is(err, krcore.ErrDaemonGone) {
		t.Errorf("after shutdown: %v, want ErrDaemonGone", err)
	}
}

// freeAddr is a local TCP address free a moment ago, for -metrics.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// get GETs path from the HTTP server at addr.
func get(t *testing.T, addr, path string) (code int, body string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestPprof serves the Go profiles beside the metrics when the config
// file's "pprof" (or -pprof) asks for them.
func TestPprof(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "krcored.sock")
	addr := freeAddr(t)
	conf := writeConfig(t, `{"pprof": true, "log_level": "warn", "metrics": "`+addr+`"}`)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-config", conf, "-socket", sock}) }()
	defer func() { cancel(); <-done }()
	attachWhenUp(t, ctx, sock)
	for _, c := range []struct{ path, want string }{
		{"/debug/pprof/", "goroutine"},
		{"/debug/pprof/goroutine?debug=1", "krcore/daemon"},
		{"/metrics", "krcored_clients 1"},
	} {
		if code, body := get(t, addr, c.path); code != http.StatusOK || !strings.Contains(body, c.want) {
			t.Errorf("%s: %d, want 200 and %q:\n%.500s", c.path, code, c.want, body)
		}
	}
	cfg, err := parse([]string{"-metrics", addr, "-pprof"})
	if err != nil || !cfg.Pprof {
		t.Errorf("-pprof: %+v %v", cfg, err)
	}
	if cfg, err := parse(nil); err != nil || cfg.Pprof {
		t.Errorf("default: pprof %v %v, want off", cfg.Pprof, err)
	}
}

// TestProviderConfig reads the ibverbs keys from a config file, with a flag
// overriding one of them.
func TestProviderConfig(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "krcored.json")
	os.WriteFile(conf, []byte(`{"provider": "ibverbs", "ib_dev": "rxe0", "ib_port": 2, "gid_idx": 3, "node": 9}`), 0o600)
	cfg, err := load([]string{"-config", conf, "-gid-idx", "1"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Provider != daemon.ProviderIBVerbs || cfg.IBDev != "rxe0" || cfg.IBPort != 2 || cfg.GIDIdx != 1 || cfg.Node != 9 {
		t.Errorf("config %+v: want ibverbs rxe0 port 2 GID 1 (the flag's) node 9", cfg)
	}
	cfg, err = load([]string{"-provider", "ibverbs", "-ib-dev", "mlx5_0", "-ib-port", "1"})
	if err != nil || cfg.IBDev != "mlx5_0" || cfg.IBPort != 1 || cfg.GIDIdx != -1 {
		t.Errorf("flags: %+v %v: want mlx5_0 port 1, GID -1 (the provider's choice)", cfg, err)
	}
}

// TestProviderUsage refuses what does not fit the provider, and an
// ibverbs daemon in a build without the rdma tag, before it binds anything.
func TestProviderUsage(t *testing.T) {
	for _, args := range [][]string{
		{"-provider", "tcp"},
		{"-ib-dev", "rxe0"},
		{"-gid-idx", "1"},
		{"-meta", "addr=127.0.0.1:1 qpn=5 qkey=1"},
		{"-etcd", "127.0.0.1:2379"},
		{"-provider", "ibverbs", "-listen", "127.0.0.1:0"},
		{"-provider", "ibverbs", "-ib-port", "0"},
		{"-provider", "ibverbs", "-gid-idx", "-2"},
	} {
		if _, err := parse(args); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	if ibverbs.Built {
		t.Skip("built with -tags rdma: no stub error to check")
	}
	sock := filepath.Join(t.TempDir(), "krcored.sock")
	err := run(context.Background(), []string{"-provider", "ibverbs", "-ib-dev", "rxe0", "-socket", sock})
	if !errors.Is(err, verbs.ErrUnsupported) || !strings.Contains(err.Error(), "built without rdma support") {
		t.Errorf("run -provider ibverbs: %v, want the provider's \"built without rdma support\"", err)
	}
	if _, err := os.Stat(sock); err == nil {
		t.Errorf("the socket %s was made", sock)
	}
}

// writeConfig writes a config file and returns its path.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	conf := filepath.Join(t.TempDir(), "krcored.json")
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return conf
}

// TestConfigRefused refuses, in the file and on the command line alike, an
// unknown key, a value of the wrong type or out of range, and says which
// key and why.
func TestConfigRefused(t *testing.T) {
	for _, c := range []struct {
		file string   // config file body, or "" for none
		args []string // flags
		want []string // in the error, besides errConfig
	}{
		{file: `{"max_vq": 4}`, want: []string{`unknown field "max_vq"`}},
		{file: `{"socket": "/tmp/x.sock", "Spin": "1us", "shareQuantum": 5}`, want: []string{"unknown field"}},
		{file: `{"client_credits": -1}`, want: []string{"client_credits", "-1", "at least 1"}},
		{file: `{"client_credits": 0}`, want: []string{"client_credits", "at least 1"}},
		{file: `{"max_vqs": -3}`, want: []string{"max_vqs", "-3", "at least 1"}},
		{file: `{"max_mr_bytes": -4096}`, want: []string{"max_mr_bytes", "at least 1"}},
		{file: `{"node": 0}`, want: []string{"node", "at least 1"}},
		{file: `{"node": -1}`, want: []string{"node"}},
		{file: `{"spin": "-1us"}`, want: []string{"spin", "-1µs", "at least 0s"}},
		{file: `{"spin": "10 microseconds"}`, want: []string{`key "spin"`}},
		{file: `{"spin": 1.5}`, want: []string{`key "spin"`, "duration"}},
		{file: `{"call_timeout": "0s"}`, want: []string{"call_timeout", "at least 1ns"}},
		{file: `{"send_timeout": "0s"}`, want: []string{"send_timeout", "0s", "at least 1ns"}},
		{file: `{"send_timeout": "soon"}`, want: []string{`key "send_timeout"`}},
		{file: `{"send_timeout": null}`, want: []string{`"send_timeout"`, "null"}},
		{file: `{"share_quantum": true}`, want: []string{`key "share_quantum"`}},
		{file: `{"allow_uids": [-1]}`, want: []string{"allow_uids"}},
		{file: `{"max_vqs": "4"}`, want: []string{"max_vqs"}},
		{file: `{"meta": 5}`, want: []string{`key "meta"`}},
		{file: `{"meta": ["addr=127.0.0.1:1"]}`, args: []string{"-listen", "127.0.0.1:0"}, want: []string{"meta"}},
		{file: `{"log_level": "loud"}`, want: []string{"log_level", "loud"}},
		{file: `{"node": 2} {"node": 3}`, want: []string{"after the JSON object"}},
		{file: `{"provider": "ibverbs", "gid_idx": -2}`, want: []string{"gid_idx", "-2", "at least -1"}},
		{args: []string{"-client-credits", "-5"}, want: []string{"client_credits (-client-credits) -5", "at least 1"}},
		{args: []string{"-max-vqs", "0"}, want: []string{"max_vqs (-max-vqs) 0"}},
		{args: []string{"-max-mr-bytes", "-1"}, want: []string{"max_mr_bytes (-max-mr-bytes) -1"}},
		{args: []string{"-spin", "-5us"}, want: []string{"spin (-spin) -5µs"}},
		{args: []string{"-call-timeout", "-1s"}, want: []string{"call_timeout (-call-timeout) -1s"}},
		{args: []string{"-send-timeout", "-2s"}, want: []string{"send_timeout (-send-timeout) -2s", "at least 1ns"}},
		{args: []string{"-node", "0"}, want: []string{"node (-node) 0"}},
		{args: []string{"-provider", "ibverbs", "-ib-port", "256"}, want: []string{"ib_port", "256"}},
		{args: []string{"-log-level", "chatty"}, want: []string{"log_level", "chatty"}},
		{args: []string{"-pprof"}, want: []string{"pprof (-pprof)", "metrics (-metrics)"}},
		{file: `{"pprof": true}`, want: []string{"pprof (-pprof)"}},
		{file: `{"pprof": "yes", "metrics": "127.0.0.1:0"}`, want: []string{"pprof"}},
		{args: []string{"-meta", "addr=127.0.0.1:1 qpn=x", "-listen", "127.0.0.1:0"}, want: []string{"-meta", "qpn=x"}},
		{args: []string{"-meta-buckets", "-1"}, want: []string{"meta_buckets (-meta-buckets) -1", "1..1048576 buckets"}},
		{file: `{"meta_slots": 17}`, want: []string{"meta_slots (-meta-slots) 17", "1..16 slots"}},
		{file: `{"meta_buckets": 2097152}`, want: []string{"meta_buckets", "2097152"}},
		{args: []string{"-meta-buckets", "4096", "-meta", "addr=127.0.0.1:1 qpn=5 qkey=1", "-listen", "127.0.0.1:0"}, want: []string{"-meta-buckets", "none is embedded"}},
		// a good file does not save a bad flag, nor a good flag a bad file
		{file: `{"client_credits": 8}`, args: []string{"-client-credits", "-8"}, want: []string{"client_credits", "-8"}},
		{file: `{"client_credits": -8}`, args: []string{"-max-vqs", "8"}, want: []string{"client_credits", "-8"}},
	} {
		args := c.args
		if c.file != "" {
			args = append([]string{"-config", writeConfig(t, c.file)}, args...)
		}
		_, err := parse(args)
		if err == nil {
			t.Errorf("%s %q: accepted", c.file, c.args)
			continue
		}
		if !errors.Is(err, errConfig) {
			t.Errorf("%s %q: %v: not errConfig", c.file, c.args, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s %q: %v: does not say %q", c.file, c.args, err, w)
			}
		}
	}
}

// TestConfigDurations reads the file's durations as Go duration strings, as
// the flags take them, or as integer nanoseconds; a flag overrides the file.
func TestConfigDurations(t *testing.T) {
	conf := writeConfig(t, `{"spin": "10us", "share_quantum": "-1ns", "call_timeout": 2000000000, "send_timeout": "30s", "client_credits": 16, "max_vqs": 2, "max_mr_bytes": 65536}`)
	cfg, err := parse([]string{"-config", conf})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Spin != 10*time.Microsecond || cfg.ShareQuantum != -1 || cfg.CallTimeout != 2*time.Second ||
		cfg.SendTimeout != 30*time.Second || cfg.ClientCredits != 16 || cfg.MaxVQs != 2 || cfg.MaxMRBytes != 65536 {
		t.Errorf("config %+v: want spin 10us, share quantum -1ns, call timeout 2s, send timeout 30s, credits 16, 2 VQs, 64 KiB", cfg.Config)
	}
	cfg, err = parse([]string{"-config", conf, "-spin", "3us", "-call-timeout", "1m", "-send-timeout", "1500ms"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Spin != 3*time.Microsecond || cfg.CallTimeout != time.Minute || cfg.SendTimeout != 1500*time.Millisecond || cfg.ClientCredits != 16 {
		t.Errorf("config %+v: want the flags' spin 3us, call timeout 1m and send timeout 1.5s, the file's credits 16", cfg.Config)
	}
	if nc, err := cfg.node(); err != nil || nc.Config.SendTimeout != 1500*time.Millisecond {
		t.Errorf("the daemon's config %+v %v: want send timeout 1.5s", nc.Config, err)
	}
	cfg, err = parse(nil)
	if err != nil || cfg.ClientCredits != 256 || cfg.MaxVQs != 64 || cfg.MaxMRBytes != 1<<30 ||
		cfg.CallTimeout != 5*time.Second || cfg.SendTimeout != 5*time.Second {
		t.Errorf("defaults %+v %v: want 256 credits, 64 VQs, 1 GiB, 5s call and send timeouts", cfg, err)
	}
}

// TestConfigMetaTable sizes the embedded MetaServer's table from the file
// and the flags, a flag winning; 0 keeps meta's defaults.
func TestConfigMetaTable(t *testing.T) {
	conf := writeConfig(t, `{"meta_buckets": 32768, "meta_slots": 8}`)
	cfg, err := parse([]string{"-config", conf})
	if err != nil {
		t.Fatal(err)
	}
	if nc, err := cfg.node(); err != nil || nc.MetaBuckets != 32768 || nc.MetaSlots != 8 {
		t.Errorf("file: %+v %v: want a table of 32768 x 8", nc, err)
	}
	cfg, err = parse([]string{"-config", conf, "-meta-buckets", "1024"})
	if nc, _ := cfg.node(); err != nil || nc.MetaBuckets != 1024 || nc.MetaSlots != 8 {
		t.Errorf("flag over file: %+v %v: want 1024 x 8", nc, err)
	}
	if cfg, err = parse(nil); err != nil || cfg.MetaBkts != 0 || cfg.MetaSlts != 0 {
		t.Errorf("defaults: %+v %v: want 0 x 0 (meta's)", cfg, err)
	}
}

// TestConfigMeta takes several MetaServers: a list in the file, a repeated
// -meta on the command line, which replaces the file's list.
func TestConfigMeta(t *testing.T) {
	a, b, c := "addr=127.0.0.1:1 qpn=5 qkey=1", "addr=127.0.0.1:2 qpn=6 qkey=1", "addr=127.0.0.1:3 qpn=7 qkey=1"
	conf := writeConfig(t, `{"listen": "127.0.0.1:0", "meta": ["`+a+`", "`+b+`"]}`)
	cfg, err := parse([]string{"-config", conf})
	if err != nil {
		t.Fatal(err)
	}
	infos, err := cfg.Meta.infos()
	if err != nil || len(infos) != 2 || infos[0].QPN != 5 || infos[1].QPN != 6 {
		t.Errorf("file: %v %v: want MetaServers with QPNs 5 and 6", infos, err)
	}
	cfg, err = parse([]string{"-config", conf, "-meta", c, "-meta", a})
	if err != nil {
		t.Fatal(err)
	}
	if infos, err = cfg.Meta.infos(); err != nil || len(infos) != 2 || infos[0].QPN != 7 || infos[1].QPN != 5 {
		t.Errorf("flags: %v %v: want the command line's MetaServers, QPNs 7 and 5", infos, err)
	}
	conf = writeConfig(t, `{"listen": "127.0.0.1:0", "meta": "`+b+`"}`)
	if cfg, err = parse([]string{"-config", conf}); err != nil || len(cfg.Meta) != 1 {
		t.Errorf("one string: %v %v: want one MetaServer", cfg, err)
	}
}

// metaServer starts a MetaServer on a soft RNIC over TCP; stop takes it
// down (server and RNIC), as when its host goes.
func metaServer(t *testing.T) (info string, stop func()) {
	t.Helper()
	dev, err := soft.NewFabric().NewNode(soft.Config{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := meta.NewServer(dev, meta.ServerConfig{})
	if err != nil {
		dev.Close()
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() { once.Do(func() { srv.Close(); dev.Close() }) }
	t.Cleanup(stop)
	return srv.Info().String(), stop
}

// attachWhenUp attaches to the daemon starting at sock.
func attachWhenUp(t *testing.T, ctx context.Context, sock string) *client.Client {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := client.Attach(actx, client.Options{Socket: sock})
		cancel()
		if err == nil {
			t.Cleanup(func() { c.Close() })
			return c
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond) // the daemon is starting
	}
}

// TestMetaFailover runs krcored with two MetaServers (-meta twice) and
// node 2 registered with both; with the first MetaServer down, a client's
// cold Connect through the daemon is answered by the second and its READ
// of node 2 works.
func TestMetaFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, stopA := metaServer(t)
	b, _ := metaServer(t)
	infoA, _ := meta.ParseInfo(a)
	infoB, _ := meta.ParseInfo(b)
	dev2, err := soft.NewFabric().NewNode(soft.Config{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer dev2.Close()
	rt2, err := core.New(ctx, core.Config{Device: dev2, Node: 2, Meta: []meta.Info{infoA, infoB}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt2.Close()
	table, _ := rt2.RegMR(4096, verbs.AccessAll)
	copy(table.Bytes(), "hello from node 2")
	if err := rt2.Export("table", table, 0, 4096, verbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}

	sock := filepath.Join(t.TempDir(), "krcored.sock")
	dctx, dcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- run(dctx, []string{"-socket", sock, "-node", "1", "-listen", "127.0.0.1:0", "-meta", a, "-meta", b, "-log-level", "error"})
	}()
	defer func() { dcancel(); <-done }()
	c := attachWhenUp(t, ctx, sock)

	stopA()
	q, err := c.Queue()
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Connect(ctx, 2, nil); err != nil {
		t.Fatalf("connect with the first MetaServer down: %v", err)
	}
	g, err := q.Region(ctx, "table")
	if err != nil {
		t.Fatal(err)
	}
	buf, _ := c.RegMR(4096, verbs.AccessAll)
	if _, err := q.Push(ctx, true, krcore.Request{Op: verbs.OpRead, Local: buf.Range(0, 17), Remote: g.At(0)}); err != nil {
		t.Fatal(err)
	}
	out := make([]krcore.Completion, 1)
	if _, err := q.PopWait(ctx, out); err != nil || out[0].Err() != nil || string(buf.Bytes()[:17]) != "hello from node 2" {
		t.Fatalf("READ of node 2: %v %+v %q", err, out[0], buf.Bytes()[:17])
	}
	raw, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var st wire.Status
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	if st.Meta.Failovers == 0 {
		t.Errorf("meta cache %+v: want a failover to the second MetaServer", st.Meta)
	}
}

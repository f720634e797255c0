package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/meta/etcdstore"
	"github.com/krcore/krcore/provider/ibverbs"
)

// config is the daemon's configuration: file, then flags.
type config struct {
	daemon.Config
	Node     uint64   `json:"node"`
	Listen   string   `json:"listen"`
	Provider string   `json:"provider"`
	IBDev    string   `json:"ib_dev"`
	IBPort   int      `json:"ib_port"`
	GIDIdx   int      `json:"gid_idx"`
	Meta     metaList `json:"meta"`
	MetaBkts int      `json:"meta_buckets"`
	MetaSlts int      `json:"meta_slots"`
	Etcd     string   `json:"etcd"`
	EtcdPfx  string   `json:"etcd_prefix"`
	Metrics  string   `json:"metrics"`
	Pprof    bool     `json:"pprof"`
	LogLevel string   `json:"log_level"`
}

// newConfig is the configuration before the file and the flags: the file
// starts from it too, so a key it leaves out keeps the flag's default. The
// daemon's limits are spelled out here (not left 0 for daemon.New to fill
// in) so that 0 from a flag or the file is a value checked like any other.
func newConfig() *config {
	return &config{Node: 1, LogLevel: "info", Provider: daemon.ProviderSoft, IBPort: 1, GIDIdx: -1,
		Config: daemon.Config{MaxVQs: 64, MaxMRBytes: 1 << 30, ClientCredits: 256, CallTimeout: 5 * time.Second, SendTimeout: 5 * time.Second}}
}

// errConfig reports a configuration krcored refuses: an unknown key, a
// value of the wrong type or out of range, flags that do not fit together.
var errConfig = errors.New("bad configuration")

// parse reads the configuration (load) and checks it.
func parse(args []string) (*config, error) {
	cfg, err := load(args)
	if err != nil {
		return nil, err
	}
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("%w: %w", errConfig, err)
	}
	return cfg, nil
}

// load reads the config file, if -config names one, and the flags over it:
// the flags are parsed once to find the file, and again over the file's
// values, so a flag given on the command line wins.
func load(args []string) (*config, error) {
	cfg := newConfig()
	fs, file := flags(cfg)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%w: unexpected argument %q: krcored takes flags only", errConfig, fs.Arg(0))
	}
	if *file == "" {
		return cfg, nil
	}
	cfg = newConfig()
	if err := cfg.readFile(*file); err != nil {
		return nil, err
	}
	fs, _ = flags(cfg)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return cfg, nil
}

// flags binds krcored's flags to cfg, their defaults cfg's values.
func flags(cfg *config) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet("krcored", flag.ContinueOnError)
	file := fs.String("config", "", "JSON config file (flags override it)")
	fs.StringVar(&cfg.Socket, "socket", cfg.Socket, "Unix socket (default $XDG_RUNTIME_DIR/krcored.sock or /run/krcored.sock)")
	fs.StringVar(&cfg.Group, "group", cfg.Group, "group owning the socket (mode 0660); its members may attach")
	fs.Uint64Var(&cfg.Node, "node", cfg.Node, "this node's cluster-wide id (at least 1)")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "soft RNIC TCP address for other hosts (empty: in-memory only)")
	fs.StringVar(&cfg.Provider, "provider", cfg.Provider, "RNIC: soft (the pure-Go soft RNIC) or ibverbs (a real device; needs -tags rdma)")
	fs.StringVar(&cfg.IBDev, "ib-dev", cfg.IBDev, "ibverbs: RDMA `device` (default the first, as ibv_devices lists them)")
	fs.IntVar(&cfg.IBPort, "ib-port", cfg.IBPort, "ibverbs: device port")
	fs.IntVar(&cfg.GIDIdx, "gid-idx", cfg.GIDIdx, "ibverbs: GID table `index` (-1: a RoCE v2 IPv4-mapped GID if there is one)")
	fs.Var(&metaFlag{list: &cfg.Meta}, "meta", "a remote MetaServer (\"addr=HOST:PORT qpn=N qkey=N\"); repeat it for several, which the runtime fails over between; none embeds one")
	fs.IntVar(&cfg.MetaBkts, "meta-buckets", cfg.MetaBkts, fmt.Sprintf("the embedded MetaServer's table buckets, 1 to %d (0: %d); for N nodes a power of two of at least 2N, with -meta-slots 8", meta.MaxBuckets, meta.DefaultBuckets))
	fs.IntVar(&cfg.MetaSlts, "meta-slots", cfg.MetaSlts, fmt.Sprintf("records per bucket of the embedded MetaServer's table, 1 to %d (0: %d); a lookup READs 128 B per slot", meta.MaxSlots, meta.DefaultSlots))
	fs.StringVar(&cfg.Etcd, "etcd", cfg.Etcd, "etcd client `endpoints`, comma-separated: the node registers there and the MetaServers (embedded or -meta) mirror it (empty: no etcd, the MetaServers keep the records)")
	fs.StringVar(&cfg.EtcdPfx, "etcd-prefix", cfg.EtcdPfx, "etcd key prefix of this krcore cluster (default /krcore/)")
	fs.StringVar(&cfg.Metrics, "metrics", cfg.Metrics, "HTTP address serving Prometheus metrics at /metrics (empty: off)")
	fs.BoolVar(&cfg.Pprof, "pprof", cfg.Pprof, "serve the Go runtime's profiles at /debug/pprof/ on the -metrics address")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	fs.DurationVar(&cfg.Spin, "spin", cfg.Spin, "how long a client's pump polls its rings before it sleeps (0: the runtime's adaptive few microseconds)")
	fs.IntVar(&cfg.ClientCredits, "client-credits", cfg.ClientCredits, "requests one client may have in flight over all its VQs (at least 1)")
	fs.DurationVar(&cfg.ShareQuantum, "share-quantum", cfg.ShareQuantum, "how long a client's pump may work without a break beside an interactive client before it naps three times as long (0: 50us on nodes of at most 4 CPUs, else off; negative: off)")
	fs.DurationVar(&cfg.CallTimeout, "call-timeout", cfg.CallTimeout, "bound on a client's control call that talks to other nodes (Connect, Region)")
	fs.DurationVar(&cfg.SendTimeout, "send-timeout", cfg.SendTimeout, "how long a reply waits for room in a client's socket before the daemon drops the client, which leaves its replies unread")
	fs.IntVar(&cfg.MaxVQs, "max-vqs", cfg.MaxVQs, "VQs one client may have (at least 1)")
	fs.Int64Var(&cfg.MaxMRBytes, "max-mr-bytes", cfg.MaxMRBytes, "bytes one client may register (at least 1)")
	return fs, file
}

// maxConfigBytes bounds the config file: krcored's keys fit in a few
// hundred bytes, and a file that does not end (a device, a FIFO) or a huge
// one is a mistake, read no further.
const maxConfigBytes = 1 << 20

// readFile decodes the JSON config file over cfg. A file that is not a
// regular file or is larger than maxConfigBytes, anything but one JSON
// object, a key krcored does not know (keys are matched exactly, case
// included), given twice or null, a value of the wrong type, and a duration
// that does not parse are errors naming the file and the key.
func (cfg *config) readFile(name string) error {
	b, err := readConfig(name)
	if err != nil {
		return fmt.Errorf("%w: config %s: %w", errConfig, name, err)
	}
	// The durations shadow daemon.Config's (a shallower field wins in
	// encoding/json), so they take Go duration strings.
	keys := struct {
		*config
		Spin         duration `json:"spin"`
		ShareQuantum duration `json:"share_quantum"`
		CallTimeout  duration `json:"call_timeout"`
		SendTimeout  duration `json:"send_timeout"`
	}{cfg, duration{"spin", &cfg.Spin}, duration{"share_quantum", &cfg.ShareQuantum},
		duration{"call_timeout", &cfg.CallTimeout}, duration{"send_timeout", &cfg.SendTimeout}}
	if err := checkKeys(b, jsonKeys(reflect.TypeOf(keys))); err != nil {
		return fmt.Errorf("%w: config %s: %w", errConfig, name, err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&keys); err != nil {
		return fmt.Errorf("%w: config %s: %w", errConfig, name, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: config %s: data after the JSON object", errConfig, name)
	}
	return nil
}

// readConfig reads a regular file of at most maxConfigBytes.
func readConfig(name string) ([]byte, error) {
	fi, err := os.Stat(name) // before opening: opening a FIFO waits for a writer
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (%v)", fi.Mode().Type())
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	switch {
	case err != nil:
		return nil, err
	case len(b) > maxConfigBytes:
		return nil, fmt.Errorf("larger than %d bytes", maxConfigBytes)
	case len(bytes.TrimSpace(b)) == 0:
		return nil, errors.New("empty: want a JSON object")
	}
	return b, nil
}

// checkKeys checks the shape encoding/json lets through: b is one JSON
// object whose keys are each in known, spelled exactly (encoding/json
// matches them ignoring case), given once (it keeps the last) and not
// null (it leaves the default).
func checkKeys(b []byte, known map[string]bool) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return fmt.Errorf("want a JSON object, found %s", firstWord(b))
	}
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		key := t.(string) // an object's keys are strings
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return fmt.Errorf("key %q: %w", key, err)
		}
		switch {
		case !known[key]:
			return fmt.Errorf("unknown field %q (keys are spelled exactly: lower case, words joined by underscores)", key)
		case seen[key]:
			return fmt.Errorf("key %q given twice", key)
		case string(v) == "null":
			return fmt.Errorf("key %q: null: leave the key out for its default", key)
		}
		seen[key] = true
	}
	return nil
}

// firstWord is the start of b, to show what a file holds instead of an
// object.
func firstWord(b []byte) string {
	b = bytes.TrimSpace(b)
	return strconv.Quote(string(b[:min(len(b), 16)]))
}

// jsonKeys is the JSON keys of struct type t's fields, those of embedded
// structs included.
func jsonKeys(t reflect.Type) map[string]bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	keys := map[string]bool{}
	for f := range t.Fields() {
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case tag == "-":
		case f.Anonymous && tag == "":
			maps.Copy(keys, jsonKeys(f.Type))
		case tag != "":
			keys[tag] = true
		}
	}
	return keys
}

// duration is a config file's duration: a Go duration string ("10us",
// "1.5ms") as the flags take, or an integer count of nanoseconds.
type duration struct {
	key string
	d   *time.Duration
}

// UnmarshalJSON reads a duration string or integer nanoseconds.
func (d duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("key %q: %w", d.key, err)
		}
		*d.d = v
		return nil
	}
	v, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return fmt.Errorf("key %q: %s: want a duration such as \"10us\" or integer nanoseconds", d.key, b)
	}
	*d.d = time.Duration(v)
	return nil
}

// metaList is the MetaServers krcored's runtime uses, each as
// meta.ParseInfo reads it. The config file's "meta" is a list of them or
// one string.
type metaList []string

// UnmarshalJSON reads a list of MetaServers or a single one.
func (l *metaList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*l = metaList{one}
		return nil
	}
	var list []string
	if err := json.Unmarshal(b, &list); err != nil {
		return fmt.Errorf("key \"meta\": %s: want a list of \"addr=HOST:PORT qpn=N qkey=N\" strings", b)
	}
	*l = list
	return nil
}

// node is the daemon cfg describes.
func (cfg *config) node() (daemon.NodeConfig, error) {
	infos, err := cfg.Meta.infos()
	if err != nil {
		return daemon.NodeConfig{}, err
	}
	return daemon.NodeConfig{Config: cfg.Config, Node: cfg.Node, Meta: infos, MetaBuckets: cfg.MetaBkts, MetaSlots: cfg.MetaSlts, Device: daemon.DeviceConfig{
		Provider: cfg.Provider, Listen: cfg.Listen, IBDev: cfg.IBDev, IBPort: cfg.IBPort, GIDIdx: cfg.GIDIdx}}, nil
}

// etcd opens the etcd membership store -etcd names, or returns nil
// without -etcd.
func (cfg *config) etcd() (*etcdstore.Store, error) {
	if cfg.Etcd == "" {
		return nil, nil
	}
	return etcdstore.New(etcdstore.Config{Endpoints: strings.Split(cfg.Etcd, ","), Prefix: cfg.EtcdPfx})
}

// infos parses the MetaServers.
func (l metaList) infos() ([]meta.Info, error) {
	infos := make([]meta.Info, 0, len(l))
	for _, s := range l {
		info, err := meta.ParseInfo(s)
		if err != nil {
			return nil, fmt.Errorf("meta (-meta): %w", err)
		}
		infos = append(infos, info)
	}
	return infos, nil
}

// metaFlag is the repeatable -meta: the command line's list replaces the
// config file's, and each -meta adds one.
type metaFlag struct {
	list *metaList
	set  bool
}

func (f *metaFlag) String() string {
	if f == nil || f.list == nil {
		return ""
	}
	return fmt.Sprint([]string(*f.list))
}

// Set adds a MetaServer, dropping the file's on the first.
func (f *metaFlag) Set(s string) error {
	if !f.set {
		*f.list, f.set = nil, true
	}
	*f.list = append(*f.list, s)
	return nil
}

// check refuses values out of range and flags that do not fit together or
// the chosen provider, naming the key (and its flag) and why.
func (cfg *config) check() error {
	if err := cfg.checkRanges(); err != nil {
		return err
	}
	if _, err := cfg.Meta.infos(); err != nil {
		return err
	}
	if err := cfg.checkMetaTable(); err != nil {
		return err
	}
	if cfg.Pprof && cfg.Metrics == "" {
		return errors.New("pprof (-pprof) serves on the metrics address: set metrics (-metrics) too")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return fmt.Errorf("log_level (-log-level) %q: want debug, info, warn or error", cfg.LogLevel)
	}
	return cfg.checkProvider()
}

// checkRanges checks every numeric key.
func (cfg *config) checkRanges() error {
	for _, c := range []struct {
		key, flag string
		v, min    int64
	}{
		{"node", "node", int64(min(cfg.Node, 1<<62)), 1},
		{"ib_port", "ib-port", int64(cfg.IBPort), 1},
		{"gid_idx", "gid-idx", int64(cfg.GIDIdx), -1},
		{"client_credits", "client-credits", int64(cfg.ClientCredits), 1},
		{"max_vqs", "max-vqs", int64(cfg.MaxVQs), 1},
		{"max_mr_bytes", "max-mr-bytes", cfg.MaxMRBytes, 1},
		{"spin", "spin", int64(cfg.Spin), 0},
		{"call_timeout", "call-timeout", int64(cfg.CallTimeout), 1},
		{"send_timeout", "send-timeout", int64(cfg.SendTimeout), 1},
	} {
		if c.v < c.min {
			return fmt.Errorf("%s (-%s) %s: want at least %s", c.key, c.flag, show(c.key, c.v), show(c.key, c.min))
		}
	}
	if cfg.IBPort > 255 {
		return fmt.Errorf("ib_port (-ib-port) %d: ports are numbered 1 to 255", cfg.IBPort)
	}
	return nil
}

// checkMetaTable checks the embedded MetaServer's table size, which only
// a daemon that embeds one (no -meta) takes.
func (cfg *config) checkMetaTable() error {
	if err := meta.CheckEmbeddedTable(len(cfg.Meta), cfg.MetaBkts, cfg.MetaSlts); err != nil {
		return fmt.Errorf("meta_buckets (-meta-buckets) %d, meta_slots (-meta-slots) %d: %w", cfg.MetaBkts, cfg.MetaSlts, err)
	}
	return nil
}

// show prints a key's value: durations as durations.
func show(key string, v int64) string {
	switch key {
	case "spin", "call_timeout", "send_timeout":
		return time.Duration(v).String()
	}
	return strconv.FormatInt(v, 10)
}

// checkProvider refuses flags that do not fit the chosen provider, and
// -provider ibverbs in a build that cannot open a device.
func (cfg *config) checkProvider() error {
	switch cfg.Provider {
	case daemon.ProviderSoft:
		if cfg.IBDev != "" || cfg.IBPort != 1 || cfg.GIDIdx != -1 {
			return errors.New("-ib-dev, -ib-port and -gid-idx are for -provider ibverbs")
		}
		if len(cfg.Meta) > 0 && cfg.Listen == "" {
			// Without -listen the soft RNIC lives in this process's
			// memory, and joining fails only after the MetaServer's
			// retries time out.
			return errors.New("-meta on the soft RNIC needs -listen: an in-memory soft RNIC reaches no other process")
		}
		if cfg.Etcd != "" && cfg.Listen == "" {
			return errors.New("-etcd on the soft RNIC needs -listen: the other nodes' MetaServers and peers reach it over TCP")
		}
		return nil
	case daemon.ProviderIBVerbs:
	default:
		return fmt.Errorf("-provider %q: want soft or ibverbs", cfg.Provider)
	}
	switch {
	case !ibverbs.Built:
		return fmt.Errorf("-provider ibverbs: %w", ibverbs.ErrNotBuilt)
	case cfg.Listen != "":
		return errors.New("-listen is the soft RNIC's; an ibverbs device has its own address")
	}
	return nil
}

// Package server wires agentenv's parts into the one-process service that
// `agentenv serve` runs: runtime, templates, network slots, sandbox manager,
// REST API and sandbox proxy. It holds no logic of its own beyond start-up
// and shutdown order.
package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/agentenv/agentenv/internal/api"
	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/netns"
	"github.com/agentenv/agentenv/internal/proxy"
	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/runtime/gvisor"
	"github.com/agentenv/agentenv/internal/runtime/gvisorgo"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/sandboxfusion"
	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/snapshot"
	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/volume"
)

// Config is everything `agentenv serve` can be told.
type Config struct {
	Listen      string
	ProxyListen string
	DataDir     string
	Runsc       string
	Envd        string
	NetworkCIDR string
	// NetworkTag keeps the network names of several servers on one host apart.
	NetworkTag string
	// DNSResolvers are where sandboxes' DNS queries go (IP or IP:port,
	// through each slot's forwarder); none: the host's /etc/resolv.conf.
	DNSResolvers []string
	// Domain, if set, turns on the proxy's HTTPS listener (ProxyTLS) for
	// https://<port>-<sandboxID>.<Domain>; the create answer's domain
	// then names it.
	Domain string
	// ProxyTLS is the HTTPS listener's address and certificate (its
	// Domain is Domain; without a certificate, a local CA in DataDir).
	ProxyTLS ProxyTLS
	// APIKey is the single key (the host owner's: it sees every
	// sandbox); empty: the data dir's api-key file, made on first start.
	APIKey string
	// APIKeys maps named keys to their names (--api-keys-file): each sees
	// only its own sandboxes and snapshots. OperatorKey sees all.
	APIKeys     map[string]string
	OperatorKey string
	Limits      sandbox.Limits
	// Runtime says how gVisor is driven: "go" (its Go packages in-process)
	// or "cli" (the runsc binary per call).
	Runtime string
	// ReadyTemplates restores a snapshot of each booted template on create.
	ReadyTemplates bool
	// WarmPool is how many containers per ready or recently restored
	// template wait for a restore (more after a larger fork).
	WarmPool int
	// SlotPool is how many network slots are kept ready.
	SlotPool int
	// MaxVolumes caps the volumes this host holds (0: 100).
	MaxVolumes int
	// VolumeSizeMB is the size limit of each new volume (an ext4 image);
	// 0 makes plain directories without one.
	VolumeSizeMB int64
	// SnapshotPolicy bounds the disk use of snapshots nothing needs.
	SnapshotPolicy snapshot.Policy
	// DiskBudget caps what the data directory holds, as used: sandboxes'
	// write layers by their allocated blocks, templates, snapshots, the
	// build cache, uploaded build files, volumes and work in progress.
	// New work beyond it gets 507. Zero: no budget.
	DiskBudget sandbox.DiskBudget
	// DiskReserve is the free space kept on the data filesystem: new work
	// that would leave less gets 507. Zero: none (the CLI's default is
	// sandbox.DefaultDiskReserve).
	DiskReserve sandbox.DiskReserve
	// NoCgroups runs sandboxes without cgroup limits (for hosts where
	// cgroups cannot be managed).
	NoCgroups bool
	// TemplateOptions are the operator's choices for template builds
	// (import directory, Debian mirror and keyring, upload limit).
	TemplateOptions template.Options
	// StepBuilds are the choices for E2B's template-in-code builds.
	StepBuilds StepBuilds
	// OnPersist, if set, is told of every persisted sandbox state (see
	// sandbox.Deps.OnPersist); a fleet node publishes them.
	OnPersist func(sandbox.Sandbox)
	// Unreachable are addresses no sandbox may reach, whatever its
	// egress policy allows (a fleet node's etcd).
	Unreachable []netip.Prefix
	// HTTP bounds what one client holds of the API, the proxy and a fleet
	// node's port (idle and header timeouts, header size, connections
	// per source).
	HTTP HTTPLimits
	// MetricsHideTemplates leaves template names, which tenants choose,
	// out of /metrics' labels.
	MetricsHideTemplates bool
	// Metrics labels the counts of command results and sandbox ends with
	// the value of one metadata key (see metrics.Registry.SetLabelKey).
	Metrics MetricsLabel
	// SandboxFusion, when its Listen is set, serves SandboxFusion's
	// run_code API beside the E2B one.
	SandboxFusion sandboxfusion.Config
	Log           *slog.Logger

	// Network is "namespaces" (the default: a namespace, veths and
	// firewall rules per sandbox) or "none": no network and no isolation,
	// each sandbox reached at a loopback address of NetworkCIDR (inside
	// 127.0.0.0/8). None works only with NewRuntime (test-only).
	Network string
	// NewRuntime, if set, replaces the gVisor runtime: test-only, for the
	// unprivileged tier's fake runtime (internal/runtime/fake), which
	// learns each sandbox's address from nets. With Network "none" the
	// host then needs no root.
	NewRuntime func(cfg Config, nets *netns.Manager) (runtime.Runtime, error)
	// Clock runs the sandboxes' timeouts (test-only; nil: the real clock).
	Clock sandbox.Clock
}

// unprivileged says whether cfg runs without root: the fake runtime on no
// network (the unprivileged test tier).
func (cfg Config) unprivileged() bool { return cfg.Network == "none" && cfg.NewRuntime != nil }

// Host is this machine's sandbox stack: runtime, template and snapshot
// stores, network slots and the sandbox manager with its pools. `serve`
// puts the REST API and the proxy in front of it; a fleet node, its RPC
// and proxy.
type Host struct {
	Manager   *sandbox.Manager
	Templates *template.Store
	Snapshots *snapshot.Store
	// Volumes holds this host's volumes.
	Volumes *volume.Store
	// Backend is the API's view of this host.
	Backend *service.Local
	// Disk admits what this host writes to its data filesystem.
	Disk *sandbox.Disk
	// StacksLayers says whether the runtime stacks template layers
	// (runtime.LayerStacker): builds on a template then write thin ones.
	StacksLayers bool
	closers      []func()
}

// Close stops the pools and the runtime; running sandboxes stay up and
// are adopted at the next start.
func (h *Host) Close() {
	for i := len(h.closers) - 1; i >= 0; i-- {
		h.closers[i]()
	}
}

// StartHost brings up the sandbox stack of this machine: it adopts the
// sandboxes a previous run left, and keeps the pools filled until Close.
func StartHost(ctx context.Context, cfg Config) (h *Host, err error) {
	log := cfg.Log
	if os.Geteuid() != 0 && !cfg.unprivileged() {
		return nil, errors.New("agentenv needs root to run sandboxes (network namespaces, cgroups, gVisor): run it with sudo")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	// Whoever made it, the data dir (API key, templates, snapshots) is for
	// root alone.
	if err := os.Chmod(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	envdPath, err := findEnvd(cfg.Envd)
	if err != nil {
		return nil, err
	}
	h = &Host{}
	// Every failure returns a nil Host: close this one.
	started := h
	defer func() {
		if err != nil {
			started.Close()
		}
	}()
	nets, err := newNetwork(cfg)
	if err != nil {
		return nil, err
	}
	rt, err := newRuntime(cfg, nets)
	if err != nil {
		return nil, err
	}
	if c, ok := rt.(io.Closer); ok {
		// Last: stops the gVisor workers once nothing creates sandboxes.
		h.closers = append(h.closers, func() { c.Close() })
	}
	log.Info("runtime", "driver", cfg.Runtime, "runsc", rt.Version())
	budget, how, err := cfg.DiskBudget.Resolve(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	reserve, err := cfg.DiskReserve.Resolve(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	// Builds reserve through disk, made once the stores it counts are open
	// (none runs before: a nil Disk admits everything).
	var disk *sandbox.Disk
	topts := cfg.TemplateOptions
	topts.Reserve = func(what string, n int64) (func(), error) { return disk.Charge(what, n) }
	if topts.CodeInterpreter == "" {
		// Shipped beside envd (make build); without it, code interpreter
		// builds are refused with a message saying so.
		if p := filepath.Join(filepath.Dir(envdPath), "codeinterp"); fileExists(p) {
			topts.CodeInterpreter = p
		}
	}
	templates, err := template.OpenWithOptions(filepath.Join(cfg.DataDir, "templates"), envdPath, topts, log)
	if err != nil {
		return nil, err
	}
	if err := nets.CheckRange(); err != nil {
		return nil, err
	}
	nets.SetUnreachable(cfg.Unreachable)
	if err := nets.InstallFirewall(ctx); err != nil {
		return nil, err
	}
	snaps, err := snapshot.Open(filepath.Join(cfg.DataDir, "snapshots"))
	if err != nil {
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	snaps.SetPolicy(cfg.SnapshotPolicy)
	disk = sandbox.NewDisk(sandbox.DiskConfig{Budget: budget, Reserve: reserve, Dir: cfg.DataDir, Templates: templates.DiskBytes, Snapshots: snaps.StoredBytes})
	// A template's image that snapshots were taken on outlives its
	// replacement (rebuild, new envd) while they exist.
	templates.SetRetain(func(name, imageID string) bool {
		for _, sn := range snaps.ListAll() {
			if sn.Template == name && sn.ImageID == imageID {
				return true
			}
		}
		return false
	})
	// So do the layers under it.
	templates.SetRetainLayers(func(digest string) bool {
		for _, sn := range snaps.ListAll() {
			if slices.Contains(sn.Lowers, digest) {
				return true
			}
		}
		return false
	})
	if ls, ok := rt.(runtime.LayerStacker); ok {
		h.StacksLayers = ls.StacksLayers()
	}
	slots := netns.NewPool(nets, cfg.SlotPool, log)
	mgr, err := sandbox.New(sandbox.Deps{
		Runtime: rt, Templates: templates, Net: nets, Slots: slots, Snapshots: snaps, Disk: disk, ReadyTemplates: cfg.ReadyTemplates, WarmPool: cfg.WarmPool,
		Dir: filepath.Join(cfg.DataDir, "sandboxes"), Limits: cfg.Limits, Log: log, OnPersist: cfg.OnPersist, Clock: cfg.Clock,
	})
	if err != nil {
		return nil, err
	}
	h.Manager, h.Templates, h.Snapshots, h.Disk = mgr, templates, snaps, disk
	vols, err := volume.Open(volume.Config{Dir: filepath.Join(cfg.DataDir, "volumes"), MaxVolumes: cfg.MaxVolumes, SizeMB: cfg.VolumeSizeMB, InUse: mgr.VolumeUsers, Meter: disk.Opener()})
	if err != nil {
		return nil, fmt.Errorf("volume store: %w", err)
	}
	h.Volumes = vols
	h.closers = append(h.closers, vols.Close)
	h.Backend = &service.Local{Manager: mgr, TemplateStore: templates, SnapshotStore: snaps, Volumes: vols}
	adopted, lost, err := mgr.Recover(ctx)
	if err != nil {
		return nil, fmt.Errorf("recover sandboxes: %w", err)
	}
	if len(adopted)+len(lost) > 0 {
		log.Info("recovered after restart", "adopted", len(adopted), "lost", len(lost))
	}
	disk.Attach(mgr)
	disk.AddSource(sandbox.DiskSource{Name: "volumes", Bytes: vols.DiskBytes})
	log.Info("disk admission", "reserve", sandbox.FormatBytes(reserve), "budget", sandbox.FormatBytes(budget), "budget from", how, "use", disk.DescribeUse())
	if budget <= 0 && reserve <= 0 {
		log.Warn("no disk reserve or budget (--disk-reserve 0, --disk-budget none): builds, uploads and snapshots can fill the data filesystem")
	}
	if err := templates.RefreshEnvd(ctx); err != nil {
		return nil, err
	}
	if err := templates.EnsureBusybox(ctx); err != nil {
		return nil, fmt.Errorf("build busybox template: %w", err)
	}

	bg, stopBg := context.WithCancel(context.WithoutCancel(ctx))
	go collectSnapshots(bg, snaps, templates, cfg.SnapshotPolicy, log)
	// Make every template ready in the background; until a template is
	// ready, its sandboxes boot.
	go func() {
		for _, t := range templates.List() {
			if err := mgr.MakeReady(bg, t.Name, false); err != nil {
				log.Warn("template not ready; its sandboxes will boot", "template", t.Name, "err", err)
			}
		}
	}()
	go slots.Run(bg)
	warmDone, hotDone := make(chan struct{}), make(chan struct{})
	go func() { mgr.RunWarm(bg); close(warmDone) }()
	go func() { mgr.RunHot(bg); close(hotDone) }()
	h.closers = append(h.closers, func() { stopBg(); <-warmDone; <-hotDone; slots.Close() })
	return h, nil
}

// Run serves until ctx ends. ready, if not nil, is called with the bound
// addresses once both listeners accept connections.
func Run(ctx context.Context, cfg Config, ready func(apiAddr, proxyAddr string)) error {
	log := cfg.Log
	if os.Geteuid() != 0 && !cfg.unprivileged() {
		return errors.New("agentenv serve needs root (network namespaces, cgroups, gVisor): run it with sudo")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	key, err := apiKey(cfg, log)
	if err != nil {
		return err
	}
	ptls := cfg.ProxyTLS
	ptls.Domain, ptls.Log = cfg.Domain, log
	if ptls.CADir == "" {
		ptls.CADir = cfg.DataDir
	}
	// Before the host starts: a wrong --domain or certificate is told at
	// once, not after adopting sandboxes and building templates.
	if err := ptls.Check(); err != nil {
		return err
	}
	acfg := api.Config{APIKey: key, APIKeys: cfg.APIKeys, OperatorKey: cfg.OperatorKey, Domain: cfg.Domain, Log: log}
	if err := api.CheckKeys(acfg); err != nil {
		return err
	}
	reg := NewMetrics("serve")
	if err := cfg.Metrics.Apply(reg); err != nil {
		return err
	}
	if cfg.MetricsHideTemplates {
		reg.HideTemplateNames()
	}
	if cfg.SandboxFusion.Listen != "" {
		if err := cfg.SandboxFusion.Check(); err != nil {
			return err
		}
	}
	h, err := StartHost(ctx, cfg)
	if err != nil {
		return err
	}
	defer h.Close()

	front, err := ListenFront(cfg.Listen, cfg.ProxyListen, ptls)
	if err != nil {
		return err
	}
	front.Limits = cfg.HTTP
	WatchHost(reg, h)
	backend := service.Metered(h.Backend, reg)
	go reg.RunHistory(ctx, LiveInterval, LiveKeep)
	acfg.Backend, acfg.Domain, acfg.Metrics = backend, front.Domain, reg
	builds, err := newStepBuilds(cfg, h)
	if err != nil {
		return err
	}
	// Before the host closes: a build's sandboxes and slots go first.
	defer builds.Close()
	acfg.TemplateBuilds = builds
	a := api.New(acfg)
	apiH := WithKeyedMetrics(reg, a.Handler(), a.Scrape(reg.Handler()))
	proxyH := proxy.Metered(reg, proxy.New(h.Manager, log))
	stopSF := func() {}
	if cfg.SandboxFusion.Listen != "" {
		if stopSF, err = ServeSandboxFusion(ctx, cfg.SandboxFusion, backend, front.Addrs().Proxy, cfg.HTTP, log); err != nil {
			return err
		}
	}
	err = front.Serve(ctx, log, "agentenv", apiH, proxyH, ready)
	// Before the manager shuts down: the service kills its pooled sandboxes.
	stopSF()
	log.Info("shutting down; running sandboxes stay up and are adopted at the next start")
	h.Manager.Shutdown()
	return err
}

// apiKey returns the configured key, or the one stored in the data dir,
// generating and storing one on first start.
func apiKey(cfg Config, log *slog.Logger) (string, error) {
	if cfg.APIKey != "" {
		return cfg.APIKey, nil
	}
	path := filepath.Join(cfg.DataDir, "api-key")
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		log.Info("using the API key stored in the data dir", "path", path)
		return strings.TrimSpace(string(b)), nil
	}
	b := make([]byte, 20)
	rand.Read(b)
	key := "e2b_" + hex.EncodeToString(b)
	if err := atomicfile.WriteFile(path, []byte(key+"\n"), 0o600); err != nil {
		return "", err
	}
	log.Info("generated an API key (set AGENTENV_API_KEY to choose one)", "path", path)
	return key, nil
}

// findEnvd locates the envd binary: the flag, next to this executable, or
// on PATH.
func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

func findEnvd(flag string) (string, error) {
	if flag != "" {
		if _, err := os.Stat(flag); err != nil {
			return "", fmt.Errorf("envd binary %s: %w (run make build)", flag, err)
		}
		return flag, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "envd")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("envd binary not found next to agentenv: run `make build` or pass --envd")
}

// collectSnapshots applies the snapshot retention policy every minute.
func collectSnapshots(ctx context.Context, s *snapshot.Store, templates *template.Store, p snapshot.Policy, log *slog.Logger) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		if ids := s.GC(p); len(ids) > 0 {
			log.Info("garbage-collected snapshots", "snapshots", ids)
		}
		// Template images kept for snapshots that are gone now.
		if n := templates.SweepRetired(); n > 0 {
			log.Info("removed template images no snapshot needs", "images", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// newRuntime builds the configured gVisor driver. Both keep runsc's state
// layout and version string, so a server can restart with the other one
// and adopt its sandboxes.
func newRuntime(cfg Config, nets *netns.Manager) (runtime.Runtime, error) {
	if cfg.NewRuntime != nil {
		return cfg.NewRuntime(cfg, nets)
	}
	if nets.Loopback() {
		return nil, errors.New("--network none runs only with the test tier's fake runtime: gVisor sandboxes need a network namespace")
	}
	root := filepath.Join(cfg.DataDir, "runsc")
	switch cfg.Runtime {
	case "cli":
		return gvisor.New(gvisor.Config{Runsc: cfg.Runsc, Root: root, Cgroups: !cfg.NoCgroups})
	case "go", "":
		return gvisorgo.New(gvisorgo.Config{Runsc: cfg.Runsc, Root: root, Cgroups: !cfg.NoCgroups, Log: cfg.Log})
	}
	return nil, fmt.Errorf("--runtime %q: use go (in-process) or cli", cfg.Runtime)
}

// newNetwork makes the network slots' manager of cfg.Network.
func newNetwork(cfg Config) (*netns.Manager, error) {
	switch cfg.Network {
	case "", "namespaces":
		m, err := netns.NewManager(cfg.NetworkCIDR, cfg.NetworkTag)
		if err != nil {
			return nil, err
		}
		if err := m.SetResolvers(cfg.DNSResolvers); err != nil {
			return nil, fmt.Errorf("--dns-resolver: %w", err)
		}
		return m, nil
	case "none":
		return netns.NewLoopback(cfg.NetworkCIDR, cfg.NetworkTag)
	}
	return nil, fmt.Errorf("--network %q: use namespaces or none", cfg.Network)
}

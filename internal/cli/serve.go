package cli

import (
	"strings"

	"fmt"
	"github.com/agentenv/agentenv/internal/sandboxfusion"
	"log/slog"
	"os"
	"runtime/pprof"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentenv/agentenv/internal/api"
	"github.com/agentenv/agentenv/internal/imagebuild"
	"github.com/agentenv/agentenv/internal/metrics"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/server"
	"github.com/agentenv/agentenv/internal/template"
)

// hostFlags are the flags of the sandbox stack on this machine, shared by
// `serve` and `node`.
type hostFlags struct {
	cfg        server.Config
	debug      bool
	maxTimeout time.Duration
	uploadMB   int64
	// diskBudget, diskReserve and maxTemplateBytes are sizes as given
	// (see config).
	diskBudget       string
	diskReserve      string
	maxTemplateBytes string
}

// config finishes the host's configuration from the flags.
func (h *hostFlags) config(g *globals) (server.Config, error) {
	cfg := h.cfg
	level := slog.LevelInfo
	if h.debug {
		level = slog.LevelDebug
	}
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	cfg.DataDir = g.dataDir
	cfg.Limits.MaxTimeout = h.maxTimeout
	cfg.TemplateOptions.MaxUploadBytes = h.uploadMB << 20
	if cfg.Limits.MaxFork < 1 || cfg.Limits.MaxFork > 100 {
		return cfg, fmt.Errorf("--max-fork %d: give 1..100", cfg.Limits.MaxFork)
	}
	if d := cfg.Limits.DefaultDiskMB; d != 0 && (d < 64 || d > template.MaxDiskMB) {
		return cfg, fmt.Errorf("--disk-mb %d: give 64..%d MiB, or 0 to keep sandboxes' writes in memory", d, template.MaxDiskMB)
	}
	var err error
	if cfg.DiskBudget, err = sandbox.ParseDiskBudget(h.diskBudget); err != nil {
		return cfg, err
	}
	if cfg.DiskReserve, err = sandbox.ParseDiskReserve(h.diskReserve); err != nil {
		return cfg, err
	}
	if m := &cfg.TemplateOptions.MaxDiskMB; *m == 0 {
		*m = max(template.DefaultMaxDiskMB, cfg.Limits.DefaultDiskMB)
	} else if *m < 64 || *m > template.MaxDiskMB {
		return cfg, fmt.Errorf("--max-disk-mb %d: give 64..%d MiB", *m, template.MaxDiskMB)
	}
	if cfg.TemplateOptions.MaxTemplates < 0 {
		return cfg, fmt.Errorf("--max-templates %d: give a count, or 0 for no limit", cfg.TemplateOptions.MaxTemplates)
	}
	if cfg.TemplateOptions.MaxTemplateBytes, err = sandbox.ParseSize(h.maxTemplateBytes); err != nil {
		return cfg, fmt.Errorf("--max-template-bytes: %w", err)
	}
	return cfg, nil
}

func serveCmd(g *globals) *cobra.Command {
	h := &hostFlags{cfg: server.Config{Limits: sandbox.DefaultLimits()}}
	var stop bool
	var stopWait time.Duration
	var keys keyFlags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the API server, the sandbox proxy and the sandboxes on this machine",
		Long: "Run the API server, the sandbox proxy and the sandboxes on this machine.\n\n" +
			"The server records its PID in <data-dir>/" + pidFileName + "; `agentenv serve --stop` stops that server and waits for it to exit.",
		RunE: func(cmd *cobra.Command, args []string) error {
			if stop {
				return stopServer(cmd.OutOrStdout(), g.dataDir, stopWait)
			}
			cfg, err := h.config(g)
			if err != nil {
				return err
			}
			cfg.APIKey = os.Getenv("AGENTENV_API_KEY")
			if cfg.APIKeys, cfg.OperatorKey, err = keys.load(); err != nil {
				return err
			}
			release, err := claimPidFile(g.dataDir)
			if err != nil {
				return err
			}
			defer release()
			if path := os.Getenv("AGENTENV_CPU_PROFILE"); path != "" {
				// For finding where the server's own CPU goes (docs/benchmarks.md);
				// written when the server stops.
				stopProfile, err := startCPUProfile(path)
				if err != nil {
					return err
				}
				defer stopProfile()
			}
			return server.Run(cmd.Context(), cfg, nil)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&stop, "stop", false, "stop the agentenv serve running with this --data-dir (the one its pid file names) and wait until it has exited")
	f.DurationVar(&stopWait, "stop-timeout", 2*time.Minute, "with --stop: how long to wait for the server to exit")
	f.StringVar(&h.cfg.Listen, "listen", "127.0.0.1:3000", "REST API address")
	f.StringVar(&h.cfg.ProxyListen, "proxy-listen", "127.0.0.1:3001", "sandbox proxy address")
	f.BoolVar(&h.cfg.MetricsHideTemplates, "metrics-hide-templates", false, "leave template names (which any key may choose) out of /metrics' labels: sandboxes and pools are then counted by state and pool alone")
	domainFlags(cmd, &h.cfg.Domain, &h.cfg.ProxyTLS)
	sandboxFusionFlags(cmd, &h.cfg.SandboxFusion)
	sb := &h.cfg.StepBuilds
	f.StringSliceVar(&sb.RegistryAllow, "registry-allow", nil, "registry hosts (HOST[:PORT], comma-separated) that E2B template builds' fromImage may pull from although they resolve to loopback, private or link-local addresses")
	f.StringVar(&sb.RegistryMirror, "registry-mirror", "", "registry host (HOST[:PORT]) that E2B template builds pull Docker Hub images through")
	f.Int64Var(&sb.MaxUploadMB, "max-copy-upload-mb", 2048, "largest archive, in MiB, one copy() step of an E2B template build may upload")
	f.IntVar(&sb.MaxConcurrent, "max-template-builds", 2, "E2B template builds run at once (more wait)")
	f.IntVar(&sb.Sandbox.CPUs, "build-cpus", imagebuild.DefaultLimits.CPUs, "CPU quota, in cores, of an E2B template build's sandbox when the build gives no cpuCount")
	f.IntVar(&sb.Sandbox.MemoryMB, "build-memory-mb", imagebuild.DefaultLimits.MemoryMB, "memory limit, in MiB, of an E2B template build's sandbox when the build gives no memoryMB (its /dev/shm holds half of it)")
	f.IntVar(&sb.Sandbox.Pids, "build-pids", imagebuild.DefaultLimits.Pids, "most processes in an E2B template build's sandbox (lowered for small memory limits)")
	f.Int64Var(&sb.LogMB, "build-log-mb", api.DefaultMaxLogBytes>>20, "most of one E2B template build's log the server keeps, in MiB: past it the log's middle is dropped (its first and last lines stay, and a line says what was dropped)")
	f.Int64Var(&sb.LogsTotalMB, "build-logs-total-mb", api.DefaultMaxLogBytesTotal>>20, "most of all E2B template builds' logs the server keeps together, in MiB: the oldest finished builds' logs are discarded first")
	keys.add(cmd, "it sees and controls every key's sandboxes and snapshots")
	h.add(cmd)
	return cmd
}

// add defines the host flags on cmd.
func (h *hostFlags) add(cmd *cobra.Command) {
	cfg := &h.cfg
	f := cmd.Flags()
	f.StringVar(&cfg.Runsc, "runsc", "runsc", "path of the pinned runsc binary")
	f.StringVar(&cfg.Envd, "envd", "", "path of the envd binary (default: next to agentenv)")
	f.StringVar(&cfg.NetworkCIDR, "network-cidr", "10.88.0.0/16", "host-side address range for sandbox network slots (/30 each)")
	f.StringVar(&cfg.NetworkTag, "network-tag", "", "up to 3 characters that keep this server's namespace and interface names apart from another server's on the same host")
	f.StringSliceVar(&cfg.DNSResolvers, "dns-resolver", nil, "resolvers (IP or IP:port, comma-separated) that sandboxes' DNS queries are forwarded to, from each sandbox's gateway address; default: the nameservers of the host's /etc/resolv.conf")
	f.BoolVar(&cfg.NoCgroups, "no-cgroups", false, "run sandboxes without cgroup limits")
	f.IntVar(&cfg.Limits.MaxSandboxes, "max-sandboxes", cfg.Limits.MaxSandboxes, "most sandboxes at once")
	f.IntVar(&cfg.Limits.DefaultMemMB, "default-memory-mb", cfg.Limits.DefaultMemMB, "memory limit of a sandbox whose create and template ask for none")
	f.IntVar(&cfg.Limits.DefaultDiskMB, "disk-mb", cfg.Limits.DefaultDiskMB, "size in MiB of a sandbox's write layer on disk (a sparse file; writing past it gives ENOSPC) when its template sets none; 0 keeps writes in memory")
	f.IntVar(&cfg.Limits.DefaultCPUs, "default-cpus", cfg.Limits.DefaultCPUs, "CPU limit of a sandbox whose create and template ask for none")
	f.DurationVar(&h.maxTimeout, "max-timeout", cfg.Limits.MaxTimeout, "longest sandbox timeout a client may ask for")
	f.DurationVar(&cfg.SnapshotPolicy.MaxAge, "snapshot-max-age", 7*24*time.Hour, "delete snapshots agentenv made itself (forks, ready templates) that nothing uses after this long; a user's are kept until deleted (0: never)")
	f.IntVar(&cfg.SnapshotPolicy.MaxCount, "snapshot-max-count", 1000, "keep at most this many snapshots, deleting the oldest unused that agentenv made itself; a user's are kept, and a new one is refused (507) when they fill it (0: no limit)")
	f.Int64Var(&cfg.SnapshotPolicy.MaxBytes, "snapshot-max-bytes", 50<<30, "keep snapshots within this many bytes, deleting the oldest unused that agentenv made itself; a user's are kept, and a new one is refused (507) when they fill it (0: no limit)")
	f.StringVar(&cfg.Runtime, "runtime", "go", "how to drive gVisor: go (its Go packages in-process; fast pause/resume/create) or cli (the runsc binary per call; nothing of gVisor in the server process)")
	f.BoolVar(&cfg.ReadyTemplates, "ready-templates", false, "create sandboxes by restoring a snapshot of each booted template instead of booting (faster only with an in-process runtime)")
	f.IntVar(&cfg.Limits.HotPool, "hot-pool", 0, "booted, idle sandboxes per template kept ready to hand out (creates with default limits take one: no boot on the request path)")
	f.IntVar(&cfg.WarmPool, "warm-pool", 4, "containers created in advance, waiting for a restore, per ready template and per template restored or forked in the last 10 minutes (as many as its largest fork); with --runtime go; 0: none")
	f.IntVar(&cfg.SlotPool, "slot-pool", 8, "network slots kept ready ahead of creates")
	f.IntVar(&cfg.MaxVolumes, "max-volumes", 100, "most volumes this host keeps (POST /volumes refuses more)")
	f.Int64Var(&cfg.VolumeSizeMB, "volume-size-mb", 10<<10, "size limit of each new volume, in MiB: its files live in a sparse ext4 image of that size, loop-mounted (writes past it get ENOSPC); 0: plain directories without a limit")
	f.IntVar(&cfg.Limits.MaxFork, "max-fork", cfg.Limits.MaxFork, "most children of one fork (up to 100)")
	f.StringVar(&cfg.TemplateOptions.ImportDir, "import-dir", "", "host directory whose rootfs directories and tarballs template builds may import (`template build --import`); none by default: clients upload")
	f.StringVar(&cfg.TemplateOptions.DebianMirror, "debian-mirror", "", "Debian mirror for template builds (default: this host's apt mirror); its signatures are checked")
	f.StringVar(&cfg.TemplateOptions.DebianKeyring, "debian-keyring", template.DefaultKeyring, "keyring the Debian mirror's Release files must be signed with")
	f.Int64Var(&h.uploadMB, "max-upload-mb", 8192, "most file data in one uploaded template rootfs")
	f.BoolVar(&h.debug, "debug", false, "log every request")
	f.StringVar(&h.diskReserve, "disk-reserve", sandbox.DefaultDiskReserve, "free space kept on the data dir's filesystem: creates, restores, forks, builds, uploads, snapshots and volume writes that would leave less free get 507 (a stream stops while it writes, and what it wrote is removed). A size (2G), a share of the filesystem's size (5%), or 0 for none. Space the filesystem keeps for root (ext4: 5%) never counts as free")
	f.StringVar(&h.diskBudget, "disk-budget", sandbox.DefaultDiskBudget, "most disk agentenv may hold in the data dir, counted as used (thin): sandbox write layers by their allocated blocks (each still gets ENOSPC at its own --disk-mb), templates, snapshots, the build cache, uploaded build files, volumes, and work in progress; past it new work gets 507 as for --disk-reserve. A size (500G), a share (90%: of the data dir's filesystem's free space plus what the data dir holds, measured at start), or none")
	f.IntVar(&cfg.TemplateOptions.MaxDiskMB, "max-disk-mb", 0, "largest write layer, in MiB, a client may ask for in a template build (diskMB; above it 400) (default: 10240, or --disk-mb if larger)")
	f.IntVar(&cfg.TemplateOptions.MaxTemplates, "max-templates", 5000, "most templates this server stores (builds of new names count; 0: no limit); thin templates (built on another) take about their changed files each")
	f.StringVar(&h.maxTemplateBytes, "max-template-bytes", "50G", "most disk all templates take together (root trees, images and layers, each layer once); a build past it stops with 507 (0: no limit beyond --disk-reserve and --disk-budget)")
	metricsLabelFlags(cmd, &cfg.Metrics)
	f.IntVar(&cfg.HTTP.MaxConnsPerIP, "max-conns-per-ip", 0, "most open connections from one source address (an IPv6 /64 counts as one) to the API, the proxy or the node port; more are closed at once (default: a quarter of the open-file limit, at most 4096; -1: no cap)")
	f.DurationVar(&cfg.HTTP.IdleTimeout, "http-idle-timeout", 2*time.Minute, "close a keep-alive connection of the API, the proxy or the node port that sends no request for this long")
}

// metricsLabelFlags defines the flags of the metadata label of /metrics'
// command results and sandbox ends (serve, node and api).
func metricsLabelFlags(cmd *cobra.Command, l *server.MetricsLabel) {
	f := cmd.Flags()
	f.StringVar(&l.Key, "metrics-label-key", "", "a sandbox metadata key (e.g. run) whose value labels agentenv_exec_results_total and agentenv_sandbox_ends_total in /metrics, to tell training runs apart; the label has the key's name")
	f.IntVar(&l.Values, "metrics-label-values", metrics.DefaultLabelValues, "with --metrics-label-key: most distinct values the label keeps; sandboxes with values seen after them count under \"other\" (until the server restarts), so a value per sandbox cannot grow /metrics without bound")
}

// domainFlags defines --domain and the proxy's HTTPS flags of serve and api.
func domainFlags(cmd *cobra.Command, domain *string, t *server.ProxyTLS) {
	f := cmd.Flags()
	f.StringVar(domain, "domain", "", "serve sandbox ports at https://<port>-<sandboxID>.<domain> (E2B's getHost, downloadUrl, uploadUrl) on --proxy-tls-listen, with --proxy-tls-cert or a local CA; a .localhost domain resolves to this machine (nss-myhostname). Default: no HTTPS, the create answer's domain is the proxy's address")
	f.StringVar(&t.Listen, "proxy-tls-listen", "127.0.0.1:3443", "with --domain: the sandbox proxy's HTTPS address (the create answer's domain carries its port unless it is 443)")
	f.StringVar(&t.CertFile, "proxy-tls-cert", "", "with --domain: the operator's certificate for *.<domain> (PEM, chain after it); default: one issued by the local CA (<data-dir>/ca.pem)")
	f.StringVar(&t.KeyFile, "proxy-tls-key", "", "private key of --proxy-tls-cert (PEM)")
}

// sandboxFusionFlags defines the SandboxFusion service's flags of serve
// and api.
func sandboxFusionFlags(cmd *cobra.Command, c *sandboxfusion.Config) {
	f := cmd.Flags()
	f.StringVar(&c.Listen, "sandboxfusion-listen", "", "serve SandboxFusion's API (POST /run_code, POST /run_jupyter, GET /v1/ping; languages "+strings.Join(sandboxfusion.Languages(), ", ")+") on this address, each call in a fresh sandbox of the runner template; verl: sandbox_fusion_url=http://ADDR/run_code. Off loopback it needs --sandboxfusion-key")
	f.StringVar(&c.Key, "sandboxfusion-key", os.Getenv("AGENTENV_SANDBOXFUSION_KEY"), "key every SandboxFusion call must carry, as header X-API-Key (or Authorization: Bearer) or in the URL: http://ADDR/KEY/run_code (default: $AGENTENV_SANDBOXFUSION_KEY; none on loopback)")
	f.StringVar(&c.Template, "sandboxfusion-template", sandboxfusion.DefaultTemplate, "runner template of SandboxFusion calls; the default one is built when missing (Debian bookworm with "+strings.Join(sandboxfusion.RunnerPackages, ", ")+"; or: agentenv template build "+sandboxfusion.DefaultTemplate+" --debian bookworm --packages "+strings.Join(sandboxfusion.RunnerPackages, ",")+")")
	f.IntVar(&c.Pool, "sandboxfusion-pool", 4, "runner sandboxes created ahead of SandboxFusion calls (each serves one call)")
	f.IntVar(&c.MaxConcurrent, "sandboxfusion-concurrency", 16, "SandboxFusion calls run at once; more wait")
	f.IntVar(&c.MemoryMB, "sandboxfusion-memory-mb", 1280, "memory of a pooled runner sandbox; a call whose memory_limit_MB needs more (plus 256 MiB) gets a sandbox of its own size")
}

// startCPUProfile writes the process's CPU profile to path until the
// returned function is called (AGENTENV_CPU_PROFILE).
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("AGENTENV_CPU_PROFILE: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("AGENTENV_CPU_PROFILE: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

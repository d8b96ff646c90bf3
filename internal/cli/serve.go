package cli

import (
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"agentenv/internal/sandbox"
	"agentenv/internal/server"
)

func serveCmd(g *globals) *cobra.Command {
	cfg := server.Config{Limits: sandbox.DefaultLimits()}
	var debug bool
	var maxTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the API server, the sandbox proxy and the sandboxes on this machine",
		RunE: func(cmd *cobra.Command, args []string) error {
			level := slog.LevelInfo
			if debug {
				level = slog.LevelDebug
			}
			cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			cfg.DataDir = g.dataDir
			cfg.APIKey = os.Getenv("AGENTENV_API_KEY")
			cfg.Limits.MaxTimeout = maxTimeout
			return server.Run(cmd.Context(), cfg, nil)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:3000", "REST API address")
	f.StringVar(&cfg.ProxyListen, "proxy-listen", "127.0.0.1:3001", "sandbox proxy address")
	f.StringVar(&cfg.Runsc, "runsc", "runsc", "path of the pinned runsc binary")
	f.StringVar(&cfg.Envd, "envd", "", "path of the envd binary (default: next to agentenv)")
	f.StringVar(&cfg.NetworkCIDR, "network-cidr", "10.88.0.0/16", "host-side address range for sandbox network slots (/30 each)")
	f.StringVar(&cfg.NetworkTag, "network-tag", "", "up to 3 characters that keep this server's namespace and interface names apart from another server's on the same host")
	f.StringVar(&cfg.Domain, "domain", "", "domain for <port>-<sandboxID>.<domain> host routing (default: the proxy address)")
	f.BoolVar(&cfg.NoCgroups, "no-cgroups", false, "run sandboxes without cgroup limits")
	f.IntVar(&cfg.Limits.MaxSandboxes, "max-sandboxes", cfg.Limits.MaxSandboxes, "most sandboxes at once")
	f.IntVar(&cfg.Limits.DefaultMemMB, "default-memory-mb", cfg.Limits.DefaultMemMB, "memory limit of a sandbox that asks for none")
	f.IntVar(&cfg.Limits.DefaultCPUs, "default-cpus", cfg.Limits.DefaultCPUs, "CPU limit of a sandbox that asks for none")
	f.DurationVar(&maxTimeout, "max-timeout", cfg.Limits.MaxTimeout, "longest sandbox timeout a client may ask for")
	f.BoolVar(&debug, "debug", false, "log every request")
	return cmd
}

package cli

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/fleet"
	"github.com/agentenv/agentenv/internal/fleetroles"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/server"
)

// nodeCmd is both the node agent (`agentenv node --etcd ...`) and the
// node admin commands (`agentenv node list|cordon|uncordon|drain`).
func nodeCmd(g *globals) *cobra.Command {
	h := &hostFlags{cfg: server.Config{Limits: sandbox.DefaultLimits()}}
	var run fleetroles.NodeRun
	var secretFile string
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Run a fleet node agent (sandboxes on this host, registered in etcd); or list and cordon nodes",
		Long: "With --etcd, runs this host's sandboxes for a fleet: it registers in etcd under a lease and serves\n" +
			"API servers (agentenv api) over its --listen address, which answers only callers that prove the cluster\n" +
			"secret (and, with --tls-ca, show a certificate of the fleet's CA).\n" +
			"The subcommands talk to an API server (--server) to list, cordon, uncordon and drain nodes.",
		RunE: func(cmd *cobra.Command, args []string) error {
			if run.Etcd == "" {
				return cmd.Help()
			}
			cfg, err := h.config(g)
			if err != nil {
				return err
			}
			if run.Node.Secret, err = fleet.ReadSecret(secretFile); err != nil {
				return err
			}
			run.EtcdAuth.Password = os.Getenv("AGENTENV_ETCD_PASSWORD")
			run.Host = cfg
			return fleetroles.RunNode(cmd.Context(), run)
		},
	}
	f := cmd.Flags()
	f.StringVar(&run.Node.Name, "name", hostname(), "node name, unique in the fleet")
	f.StringVar(&run.Etcd, "etcd", "", "etcd client URLs, comma separated")
	f.StringVar(&run.Listen, "listen", "0.0.0.0:3100", "address of the node's RPC and sandbox proxy (API servers connect here)")
	f.StringVar(&run.Node.Advertise, "advertise", "", "host:port API servers reach --listen at (default: the listen address)")
	f.StringVar(&secretFile, "cluster-secret-file", "", "file holding the secret API servers and nodes share")
	f.DurationVar(&run.Node.LeaseTTL, "lease-ttl", 10*time.Second, "how long the node may go unheard before its sandboxes are reported lost")
	f.StringVar(&run.TLSCert, "tls-cert", "", "serve --listen over TLS with this certificate, also this node's client certificate towards other nodes (PEM; with --tls-key)")
	f.StringVar(&run.TLSKey, "tls-key", "", "private key of --tls-cert (PEM)")
	f.StringVar(&run.TLSCA, "tls-ca", "", "the fleet's CA (PEM): turns on mutual TLS: callers must show a certificate it signed, and other nodes are reached over TLS only")
	etcdFlags(cmd, &run.EtcdAuth)
	h.add(cmd)
	cmd.AddCommand(nodeList(g), nodeAction(g, "cordon", "Stop placing new sandboxes on a node"),
		nodeAction(g, "uncordon", "Place new sandboxes on a node again"), nodeDrain(g),
		nodeAction(g, "forget", "Remove a lost node from the fleet with the records of its sandboxes"))
	return cmd
}

// etcdFlags adds the flags of how a fleet role authenticates to etcd.
func etcdFlags(cmd *cobra.Command, a *fleet.EtcdAuth) {
	f := cmd.Flags()
	f.StringVar(&a.CA, "etcd-ca", "", "CA that signed etcd's server certificate (PEM)")
	f.StringVar(&a.Cert, "etcd-cert", "", "this role's client certificate for etcd (PEM; with --etcd-key)")
	f.StringVar(&a.Key, "etcd-key", "", "private key of --etcd-cert (PEM)")
	f.StringVar(&a.User, "etcd-user", "", "etcd user to log in as (password from AGENTENV_ETCD_PASSWORD)")
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

func nodeList(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the fleet's nodes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			nodes, err := c.Nodes(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(cmd.OutOrStdout(), nodes)
			}
			var rows [][]string
			for _, n := range nodes {
				state := "alive"
				switch {
				case !n.Alive:
					state = "lost"
				case n.Draining:
					state = "draining"
				case n.Cordoned:
					state = "cordoned"
				}
				rows = append(rows, []string{n.Name, n.Addr, state, strconv.Itoa(n.Sandboxes), strconv.Itoa(n.Capacity.MaxSandboxes),
					strconv.Itoa(n.Capacity.CPUs), fmt.Sprintf("%d/%d", n.Capacity.FreeMemoryMB, n.Capacity.MemoryMB),
					strconv.Itoa(n.Capacity.Templates), strconv.Itoa(n.Capacity.Snapshots)})
			}
			table(cmd.OutOrStdout(), "NAME\tADDR\tSTATE\tSANDBOXES\tMAX\tCPUS\tFREE/MEM MiB\tTEMPLATES\tSNAPSHOTS", rows)
			return nil
		},
	}
}

// operatorClient is the API client with the operator's key
// (AGENTENV_OPERATOR_KEY, or --api-key): node operations need it.
func operatorClient(g *globals) (*client.Client, error) {
	if k := os.Getenv("AGENTENV_OPERATOR_KEY"); k != "" && g.apiKey == "" {
		c := *g
		c.apiKey = k
		return c.client()
	}
	return g.client()
}

func nodeAction(g *globals, action, short string) *cobra.Command {
	return &cobra.Command{
		Use:   action + " NODE",
		Short: short + " (needs the operator key: AGENTENV_OPERATOR_KEY)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := operatorClient(g)
			if err != nil {
				return err
			}
			return c.NodeAction(cmd.Context(), args[0], action)
		},
	}
}

// nodeDrain cordons a node and waits until its sandboxes are gone (killed
// or timed out; running sandboxes cannot move).
func nodeDrain(g *globals) *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "drain NODE",
		Short: "Cordon a node and wait until it runs no sandboxes (needs the operator key: AGENTENV_OPERATOR_KEY)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := operatorClient(g)
			if err != nil {
				return err
			}
			if err := c.NodeAction(cmd.Context(), args[0], "drain"); err != nil {
				return err
			}
			deadline := time.Now().Add(wait)
			for {
				nodes, err := c.Nodes(cmd.Context())
				if err != nil {
					return err
				}
				left := 0
				for _, n := range nodes {
					if n.Name == args[0] {
						left = n.Sandboxes
					}
				}
				if left == 0 {
					fmt.Fprintf(cmd.OutOrStdout(), "node %s is drained\n", args[0])
					return nil
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("node %s still runs %d sandboxes after %s (it takes no new ones; kill them or wait for their timeouts)", args[0], left, wait)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "node %s: %d sandboxes left\n", args[0], left)
				time.Sleep(2 * time.Second)
			}
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", 10*time.Minute, "how long to wait for the node's sandboxes to end")
	return cmd
}

// apiCmd runs a stateless API server and sandbox proxy of a fleet.
func apiCmd(g *globals) *cobra.Command {
	var run fleetroles.APIRun
	var secretFile string
	var keys keyFlags
	var debug bool
	cmd := &cobra.Command{
		Use:   "api",
		Short: "Run a fleet API server and sandbox proxy (stateless; run several behind a load balancer)",
		RunE: func(cmd *cobra.Command, args []string) error {
			level := slog.LevelInfo
			if debug {
				level = slog.LevelDebug
			}
			run.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			var err error
			if run.Secret, err = fleet.ReadSecret(secretFile); err != nil {
				return err
			}
			run.APIKey = os.Getenv("AGENTENV_API_KEY")
			if run.APIKeys, run.OperatorKey, err = keys.load(); err != nil {
				return err
			}
			run.EtcdAuth.Password = os.Getenv("AGENTENV_ETCD_PASSWORD")
			return fleetroles.RunAPI(cmd.Context(), run)
		},
	}
	f := cmd.Flags()
	f.StringVar(&run.Etcd, "etcd", "", "etcd client URLs, comma separated")
	f.StringVar(&run.Listen, "listen", "127.0.0.1:3000", "REST API address")
	f.StringVar(&run.ProxyListen, "proxy-listen", "127.0.0.1:3001", "sandbox proxy address")
	domainFlags(cmd, &run.Domain, &run.ProxyTLS)
	sandboxFusionFlags(cmd, &run.SandboxFusion)
	f.StringVar(&run.ProxyTLS.CADir, "ca-dir", "", "with --domain and no --proxy-tls-cert: directory of the local CA (ca.pem, ca-key.pem) that issues the proxy's certificate, made there if absent; every API server behind one name needs the same")
	f.StringVar(&secretFile, "cluster-secret-file", "", "file holding the secret API servers and nodes share")
	f.StringVar(&run.TLSCA, "tls-ca", "", "the fleet's CA (PEM): nodes are then reached over mutual TLS only (with --tls-cert/--tls-key)")
	f.StringVar(&run.TLSCert, "tls-cert", "", "this API server's client certificate towards nodes (PEM; with --tls-key and --tls-ca)")
	f.StringVar(&run.TLSKey, "tls-key", "", "private key of --tls-cert (PEM)")
	keys.add(cmd, "the only key that may cordon, uncordon, drain and forget nodes (without it, nobody may); it sees every key's sandboxes")
	etcdFlags(cmd, &run.EtcdAuth)
	f.BoolVar(&debug, "debug", false, "log every request")
	metricsLabelFlags(cmd, &run.Metrics)
	return cmd
}

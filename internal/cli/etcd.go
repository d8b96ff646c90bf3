package cli

import (
	"fmt"
	"net/url"
	"time"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/embed"
)

// etcdCmd runs a single-member etcd from etcd's own Go module: enough to
// try a fleet on one machine. Production fleets run a real etcd cluster.
func etcdCmd() *cobra.Command {
	var dir, listen, name, peer, cluster string
	cmd := &cobra.Command{
		Use:   "etcd",
		Short: "Run an etcd member from etcd's Go module (one member to try a fleet on one machine; use a real etcd cluster in production)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			u, err := url.Parse(listen)
			if err != nil {
				return fmt.Errorf("--listen %q: %w", listen, err)
			}
			cfg := embed.NewConfig()
			cfg.Name, cfg.Dir = name, dir
			cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*u}, []url.URL{*u}
			if peer != "" {
				pu, err := url.Parse(peer)
				if err != nil {
					return fmt.Errorf("--listen-peer %q: %w", peer, err)
				}
				cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
				cfg.InitialCluster = name + "=" + peer
			}
			if cluster != "" {
				cfg.InitialCluster = cluster
				cfg.InitialClusterToken = "agentenv"
			}
			cfg.LogLevel = "warn"
			e, err := embed.StartEtcd(cfg)
			if err != nil {
				return err
			}
			defer e.Close()
			select {
			case <-e.Server.ReadyNotify():
			case <-time.After(60 * time.Second):
				return fmt.Errorf("etcd not ready after 60 s")
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "etcd serving at %s (data in %s)\n", listen, dir)
			select {
			case <-cmd.Context().Done():
			case err := <-e.Err():
				return err
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "data-dir", "/var/lib/agentenv-etcd", "etcd data directory")
	cmd.Flags().StringVar(&listen, "listen", "http://127.0.0.1:2379", "client URL to serve")
	cmd.Flags().StringVar(&name, "name", "default", "member name (with --initial-cluster)")
	cmd.Flags().StringVar(&peer, "listen-peer", "", "peer URL of this member (default: etcd's, http://localhost:2380)")
	cmd.Flags().StringVar(&cluster, "initial-cluster", "", "the members of a new cluster: name=peerURL,... (default: this member alone)")
	return cmd
}

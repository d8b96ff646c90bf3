package cli

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/agentenv/agentenv/internal/fleet"
)

// etcdCmd runs a single-member etcd from etcd's own Go module: enough to
// try a fleet on one machine. Production fleets run a real etcd cluster.
func etcdCmd() *cobra.Command {
	var dir, listen, name, peer, cluster, cert, key, ca string
	cmd := &cobra.Command{
		Use:   "etcd",
		Short: "Run an etcd member from etcd's Go module (one member to try a fleet on one machine; use a real etcd cluster in production)",
		Long: "Runs an etcd member. Off loopback it serves only with --tls-cert, --tls-key and --tls-ca: clients and\n" +
			"peers must then show a certificate that CA signed (whoever can write the fleet's etcd owns its sandboxes).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			u, err := url.Parse(listen)
			if err != nil {
				return fmt.Errorf("--listen %q: %w", listen, err)
			}
			secure := cert != "" && key != "" && ca != ""
			if (cert != "" || key != "" || ca != "") && !secure {
				return errors.New("--tls-cert, --tls-key and --tls-ca go together (TLS with client-certificate authentication)")
			}
			if !secure && !fleet.IsLoopback(u.Hostname()) {
				return fmt.Errorf("--listen %s: an etcd reachable from other hosts must authenticate its clients: give --tls-cert, --tls-key and --tls-ca "+
					"(serves https:// and accepts only clients with a certificate that CA signed); without them, listen on loopback only", listen)
			}
			if secure != (u.Scheme == "https") {
				return fmt.Errorf("--listen %s: use https:// with --tls-cert/--tls-key/--tls-ca, http:// (loopback) without", listen)
			}
			cfg := embed.NewConfig()
			if secure {
				tlsInfo := transport.TLSInfo{CertFile: cert, KeyFile: key, TrustedCAFile: ca, ClientCertAuth: true}
				cfg.ClientTLSInfo, cfg.PeerTLSInfo = tlsInfo, tlsInfo
			}
			cfg.Name, cfg.Dir = name, dir
			cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*u}, []url.URL{*u}
			if peer != "" {
				pu, err := url.Parse(peer)
				if err != nil {
					return fmt.Errorf("--listen-peer %q: %w", peer, err)
				}
				if !secure && !fleet.IsLoopback(pu.Hostname()) {
					return fmt.Errorf("--listen-peer %s: peers off this host need --tls-cert, --tls-key and --tls-ca (members authenticate each other)", peer)
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
			case <-cmd.Context().Done():
				return nil // stopped before its cluster formed
			case <-time.After(60 * time.Second):
				return fmt.Errorf("etcd not ready after 60 s (do the members reach each other at their --listen-peer URLs, with certificates for those addresses?)")
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
	cmd.Flags().StringVar(&cert, "tls-cert", "", "serve clients and peers over TLS with this certificate (PEM; with --tls-key and --tls-ca)")
	cmd.Flags().StringVar(&key, "tls-key", "", "private key of --tls-cert (PEM)")
	cmd.Flags().StringVar(&ca, "tls-ca", "", "CA whose certificates clients and peers must show (client-certificate authentication)")
	return cmd
}

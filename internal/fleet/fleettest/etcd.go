// Package fleettest holds what the fleet packages' tests share: an
// in-process etcd.
package fleettest

import (
	"net"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Etcd starts a single-member etcd on unix sockets in a temporary
// directory and returns a client of it; both stop in tb.Cleanup.
func Etcd(tb testing.TB) *clientv3.Client {
	tb.Helper()
	dir := tb.TempDir()
	url := startEtcd(tb, dir, "unix://"+filepath.Join(dir, "client.sock"), "unix://"+filepath.Join(dir, "peer.sock"))
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{url}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
	})
	if err != nil {
		tb.Fatalf("etcd client: %v", err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}

// EtcdLoopback starts a single-member etcd on loopback TCP (plain HTTP,
// which fleet.Dial accepts on loopback only) and returns its client URL,
// for a fleet role started in-process; it stops in tb.Cleanup.
func EtcdLoopback(tb testing.TB) string {
	tb.Helper()
	// Port 0 is refused by etcd's URL checks; ask the kernel for two.
	return startEtcd(tb, tb.TempDir(), "http://"+freeAddr(tb), "http://"+freeAddr(tb))
}

// startEtcd starts a single-member etcd with its data under dir, serving
// clients at clientURL and its peer at peerURL, and returns clientURL once
// it is ready; it stops in tb.Cleanup.
func startEtcd(tb testing.TB, dir, clientURL, peerURL string) string {
	tb.Helper()
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(dir, "data")
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	client, peer := unixURL(tb, clientURL), unixURL(tb, peerURL)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = client, client
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = peer, peer
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		tb.Fatalf("starting etcd: %v", err)
	}
	tb.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		tb.Fatalf("etcd failed while starting: %v", err)
	case <-time.After(30 * time.Second):
		tb.Fatal("etcd not ready after 30 s")
	}
	return client[0].String()
}

func freeAddr(tb testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func unixURL(tb testing.TB, raw string) []url.URL {
	u, err := url.Parse(raw)
	if err != nil {
		tb.Fatal(err)
	}
	return []url.URL{*u}
}

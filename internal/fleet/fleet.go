// Package fleet holds what both fleet roles share: dialing etcd (and
// refusing an unauthenticated one off loopback), the cluster secret, and
// the TLS between roles. The roles themselves, `agentenv node` (package
// node: runs sandboxes and publishes what it holds) and `agentenv api`
// (package router: stateless API servers that place sandboxes and route
// every call and every byte of sandbox traffic to the owning node), are
// wired by package fleetroles over the etcd state of package store. No
// package under internal/fleet imports the REST API: they stand on the
// service seam (TestFleetStandsOnTheSeam).
package fleet

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EtcdAuth is how a fleet role authenticates to etcd: etcd is trusted
// only when it knows who is calling (client certificates, or an etcd
// user), since whoever writes there steers the fleet.
type EtcdAuth struct {
	// CA verifies etcd's server certificate (https:// endpoints); Cert
	// and Key are this role's client certificate.
	CA, Cert, Key string
	// User and Password log in as an etcd user (with etcd auth enabled).
	User, Password string
}

func (a EtcdAuth) authenticated() bool { return a.Cert != "" || a.User != "" }

// Dial connects to etcd (comma-separated URLs). Endpoints off loopback
// must be https:// and the connection authenticated: a fleet whose etcd
// anyone on the network can read or write is anyone's fleet.
func Dial(urls string, auth EtcdAuth) (*clientv3.Client, error) {
	var eps []string
	secure := true
	for _, u := range strings.Split(urls, ",") {
		if u = strings.TrimSpace(u); u == "" {
			continue
		}
		pu, err := url.Parse(u)
		if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			return nil, fmt.Errorf("--etcd %q: give URLs such as https://10.0.0.1:2379", u)
		}
		if pu.Scheme == "http" && !IsLoopback(pu.Hostname()) {
			return nil, fmt.Errorf("--etcd %s: etcd off this host must be reached over https:// with client certificates "+
				"(--etcd-ca, --etcd-cert, --etcd-key; `agentenv etcd --tls-cert ... --tls-key ... --tls-ca ...` serves so): "+
				"whoever reaches a plain etcd owns every sandbox of the fleet", u)
		}
		secure = secure && IsLoopback(pu.Hostname())
		eps = append(eps, u)
	}
	if len(eps) == 0 {
		return nil, errors.New("--etcd: give the etcd cluster's client URLs, comma separated (e.g. https://10.0.0.1:2379,https://10.0.0.2:2379)")
	}
	if !secure && !auth.authenticated() {
		return nil, errors.New("--etcd: etcd off this host needs authentication: give this role a client certificate (--etcd-cert, --etcd-key, with --etcd-ca) or an etcd user (--etcd-user and AGENTENV_ETCD_PASSWORD)")
	}
	if (auth.Cert == "") != (auth.Key == "") {
		return nil, errors.New("--etcd-cert and --etcd-key go together")
	}
	cfg := clientv3.Config{
		Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialKeepAliveTime: 5 * time.Second, DialKeepAliveTimeout: 3 * time.Second,
		Username: auth.User, Password: auth.Password,
	}
	if auth.CA != "" || auth.Cert != "" {
		info := transport.TLSInfo{CertFile: auth.Cert, KeyFile: auth.Key, TrustedCAFile: auth.CA}
		tc, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcd TLS (--etcd-ca/--etcd-cert/--etcd-key): %w", err)
		}
		cfg.TLS = tc
	}
	return clientv3.New(cfg)
}

// IsLoopback reports whether host names this host's loopback.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// EtcdAddrs returns the addresses of etcd's endpoints, which no sandbox
// may reach whatever its egress policy allows.
func EtcdAddrs(urls string) []netip.Prefix {
	var out []netip.Prefix
	for _, u := range strings.Split(urls, ",") {
		pu, err := url.Parse(strings.TrimSpace(u))
		if err != nil || pu.Hostname() == "" {
			continue
		}
		ips, err := net.LookupIP(pu.Hostname())
		if err != nil {
			continue
		}
		for _, ip := range ips {
			if a, ok := netip.AddrFromSlice(ip.To4()); ok {
				out = append(out, netip.PrefixFrom(a, 32))
			}
		}
	}
	return out
}

// ReadSecret reads the cluster secret file.
func ReadSecret(path string) (string, error) {
	if path == "" {
		return "", errors.New("--cluster-secret-file is required: a file holding the secret that API servers and nodes share (e.g. `head -c 32 /dev/urandom | base64 > secret`)")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("cluster secret: %w", err)
	}
	s := strings.TrimSpace(string(b))
	if len(s) < 16 {
		return "", fmt.Errorf("cluster secret in %s is shorter than 16 characters: use a long random one", path)
	}
	return s, nil
}

// LoadCA returns a TLS client configuration that trusts the CA in path
// (nil for an empty path: the system's roots).
func LoadCA(path string) (*tls.Config, error) {
	if path == "" {
		return nil, nil
	}
	pool, err := readPool(path)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

func readPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", path)
	}
	return pool, nil
}

// PeerTLS is the TLS configuration of a role calling nodes: the fleet's
// CA, and the role's own certificate for nodes that require one. Without
// a CA it is nil (plain HTTP allowed: a fleet on one host's loopback).
func PeerTLS(ca, cert, key string) (*tls.Config, error) {
	if (cert == "") != (key == "") {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	tc, err := LoadCA(ca)
	if err != nil || tc == nil {
		if err == nil && cert != "" {
			err = errors.New("--tls-cert needs --tls-ca: the CA of the fleet's certificates (nodes verify callers with it)")
		}
		return nil, err
	}
	if cert == "" {
		return nil, errors.New("--tls-ca turns on mutual TLS between the fleet's roles: give this role its certificate too (--tls-cert, --tls-key, signed by that CA for both server and client use)")
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	tc.Certificates = []tls.Certificate{pair}
	return tc, nil
}

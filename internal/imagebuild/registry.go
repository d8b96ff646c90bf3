package imagebuild

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// reach decides which registries a build may pull from. Any public
// address is allowed; loopback, private, link-local and other non-global
// addresses only for hosts the operator listed (--registry-allow), so a
// build request cannot make the server probe its own network. The check
// runs at dial time, on the address dialed, so neither a redirect nor a
// DNS answer that changes between check and use gets around it.
type reach struct {
	allowed map[string]bool // host:port and host, lower case
	dialer  net.Dialer
}

func newReach(hosts []string, mirror string) *reach {
	r := &reach{allowed: map[string]bool{}, dialer: net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}}
	for _, h := range append(hosts, mirror) {
		if h = strings.ToLower(strings.TrimSpace(h)); h != "" {
			r.allowed[h] = true
		}
	}
	return r
}

// listed reports whether the operator allowed host (host:port or host).
func (r *reach) listed(hostport string) bool {
	hostport = strings.ToLower(hostport)
	if r.allowed[hostport] {
		return true
	}
	host, _, err := net.SplitHostPort(hostport)
	return err == nil && r.allowed[host]
}

func (r *reach) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if r.listed(addr) {
		return r.dialer.DialContext(ctx, network, addr)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	for _, ip := range ips {
		if !public(ip) {
			return nil, errdefs.Invalid("registry %s resolves to %s, an address of this server's own network: the server's operator must allow it with --registry-allow %s", addr, ip, addr)
		}
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("registry %s: no address", addr)
	}
	// Dial the address checked, not the name again.
	return r.dialer.DialContext(ctx, network, net.JoinHostPort(ips[0].Unmap().String(), port))
}

func public(ip netip.Addr) bool {
	ip = ip.Unmap()
	return ip.IsGlobalUnicast() && !ip.IsPrivate() && !ip.IsLoopback() && !ip.IsLinkLocalUnicast() &&
		!cgnat.Contains(ip) && !ip.IsUnspecified()
}

// cgnat is shared address space (RFC 6598), not routed on the internet.
var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// transport is what every pull uses: dials go through the reach check, and
// no proxy from the environment (it would be dialed instead of the
// registry, and the check would judge the proxy).
func (r *reach) transport() http.RoundTripper {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	t.DialContext = r.dial
	return t
}

// reference parses an image reference for a pull: Docker Hub references
// go to the mirror when there is one. go-containerregistry speaks plain
// HTTP to loopback and RFC 1918 hosts by itself (after trying HTTPS).
func (b *Builder) reference(ref string) (name.Reference, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, errdefs.Invalid("fromImage %q: %v", ref, err)
	}
	reg := r.Context().RegistryStr()
	if b.cfg.Mirror != "" && reg == name.DefaultRegistry {
		s := b.cfg.Mirror + "/" + r.Context().RepositoryStr() + separator(r) + r.Identifier()
		if r, err = name.ParseReference(s); err != nil {
			return nil, fmt.Errorf("mirror %s: %w", b.cfg.Mirror, err)
		}
		return r, nil
	}
	return r, nil
}

func separator(r name.Reference) string {
	if _, ok := r.(name.Digest); ok {
		return "@"
	}
	return ":"
}

// pullOptions are the transport and credentials of a pull: the build's
// own, or none (the operator's Docker credentials are never lent to a
// build request).
func (b *Builder) pullOptions(auth *RegistryAuth) []remote.Option {
	a := authn.Anonymous
	if auth != nil && (auth.Username != "" || auth.Password != "") {
		a = &authn.Basic{Username: auth.Username, Password: auth.Password}
	}
	return []remote.Option{remote.WithTransport(b.reach.transport()), remote.WithAuth(a)}
}

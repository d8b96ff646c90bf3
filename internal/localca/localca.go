// Package localca gives the sandbox proxy its TLS certificate for
// *.<domain>: an operator's wildcard certificate, or one issued by a local
// certificate authority that the server creates once in its data dir
// (ca.pem for clients to trust, ca-key.pem readable by root alone). The CA
// is name-constrained to the domain (DNS names under it; no IP address,
// email address or URI at all), so a client that trusts it trusts it for
// nothing else. It must not be used for anything but the proxy.
package localca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
)

// File names of the local CA in its directory.
const (
	CertFile = "ca.pem"
	KeyFile  = "ca-key.pem"
)

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 90 * 24 * time.Hour
	// renewBefore is how long before its end a leaf certificate is
	// replaced (on the next handshake).
	renewBefore = 30 * 24 * time.Hour
)

// CA is a certificate authority whose key is on this machine.
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer
	// Path is the file clients trust (ca.pem).
	Path string
}

// CheckDomain says what is wrong with a --domain, nil when it is usable:
// a DNS name of at least two labels (a wildcard cannot cover a top-level
// name), without scheme, port, path or wildcard.
func CheckDomain(domain string) error {
	if domain == "" {
		return errors.New("empty domain")
	}
	if strings.ContainsAny(domain, ":/*") {
		return fmt.Errorf("domain %q: give a DNS name only (no scheme, port, path or wildcard), such as agentenv.localhost", domain)
	}
	labels := strings.Split(domain, ".")
	if len(labels) < 2 {
		return fmt.Errorf("domain %q has one label: a wildcard certificate of *.%s is refused by clients; use two or more, such as agentenv.localhost", domain, domain)
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("domain %q: label %q is not a DNS label", domain, l)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("domain %q: label %q is not a DNS label (letters, digits and '-')", domain, l)
			}
		}
	}
	return nil
}

// LoadOrCreate returns the CA in dir, creating it (constrained to domain)
// when dir holds none. A CA made for another domain is refused: its
// clients would not accept certificates for this one. A CA made before
// its constraints covered IP addresses, emails and URIs is replaced by a
// new one (its key could sign for any IP address): the server keeps
// starting, log says so, and clients must trust the new ca.pem (and drop
// the old one). log may be nil (slog's default).
func LoadOrCreate(dir, domain string, log *slog.Logger) (*CA, error) {
	if err := CheckDomain(domain); err != nil {
		return nil, err
	}
	certPath, keyPath := filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile)
	// Several servers may share the directory (API servers behind one
	// name) and start at once: one makes the CA, the others load it.
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, fmt.Errorf("local CA in %s: %w", dir, err)
	}
	defer unlock()
	ca, err := load(certPath, keyPath)
	if err == nil && ca.Permits(domain) && !fullyConstrained(ca.cert) {
		// Its key is removed with it: that is what could sign a
		// certificate for an address.
		if log == nil {
			log = slog.Default()
		}
		log.Warn("the local CA could sign certificates for any IP address, email or URI; made a new one constrained to the domain: clients must trust the new ca.pem and remove the old one",
			"ca", certPath, "domain", domain, "oldSerial", ca.cert.SerialNumber.Text(16))
		for _, p := range []string{keyPath, certPath} {
			if rerr := os.Remove(p); rerr != nil {
				return nil, fmt.Errorf("replace the local CA in %s, made without IP, email and URI constraints: %w (remove %s and %s yourself, then give clients the new %s)", dir, rerr, CertFile, KeyFile, CertFile)
			}
		}
		err = fmt.Errorf("replaced: %w", os.ErrNotExist)
	}
	switch {
	case errors.Is(err, os.ErrNotExist):
		if ca, err = create(certPath, keyPath, domain); err != nil {
			return nil, fmt.Errorf("create the local CA in %s: %w", dir, err)
		}
	case err != nil:
		return nil, fmt.Errorf("local CA in %s: %w (remove %s and %s to make a new one, then give clients the new %s)", dir, err, CertFile, KeyFile, CertFile)
	}
	if !ca.Permits(domain) {
		return nil, fmt.Errorf("the local CA %s is for %s, not %s: remove %s and %s in %s to make one for %s (clients then need the new %s)",
			certPath, strings.Join(ca.cert.PermittedDNSDomains, ", "), domain, CertFile, KeyFile, dir, domain, CertFile)
	}
	return ca, nil
}

// Permits reports whether the CA may issue certificates under domain.
func (ca *CA) Permits(domain string) bool {
	if len(ca.cert.PermittedDNSDomains) == 0 {
		return true
	}
	for _, d := range ca.cert.PermittedDNSDomains {
		if strings.EqualFold(d, domain) || strings.HasSuffix(strings.ToLower(domain), "."+strings.ToLower(d)) {
			return true
		}
	}
	return false
}

// lockDir takes an exclusive flock on dir/ca.lock until unlock.
func lockDir(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, "ca.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

func load(certPath, keyPath string) (*CA, error) {
	cb, err := os.ReadFile(certPath)
	if err != nil {
		return nil, err
	}
	kb, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(cb, kb)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("%s is not a CA certificate", certPath)
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s: key cannot sign", keyPath)
	}
	return &CA{cert: cert, key: signer, Path: certPath}, nil
}

// create writes a new CA: the key first (0600), then the certificate
// (0644), each through a temporary file and a rename, so that a crash
// leaves either no CA or a whole one.
func create(certPath, keyPath, domain string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{Organization: []string{"agentenv"}, CommonName: "agentenv local CA for " + domain + " (" + host + ")"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		// Trusting this CA trusts it for the domain alone.
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         []string{domain},
	}
	constrain(tmpl)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	if err := atomicfile.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return nil, err
	}
	if err := atomicfile.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, Path: certPath}, nil
}

// noName is a name under the reserved TLD .invalid (RFC 6761): the only
// email domain and URI host the CA permits, so no usable one.
const noName = "invalid"

// constrain adds to a CA template what it may never sign beyond DNS
// names: every IPv4 and IPv6 address is excluded, and emails and URIs are
// permitted only under .invalid. Both ends are needed: Go and OpenSSL
// read an excluded "" differently (all names / none), while a permitted
// subtree that nothing real is in means the same to both.
func constrain(c *x509.Certificate) {
	c.ExcludedIPRanges = []*net.IPNet{
		{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
		{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)},
	}
	c.PermittedEmailAddresses = []string{noName}
	c.PermittedURIDomains = []string{noName}
}

// fullyConstrained reports whether a CA certificate has what constrain
// adds (a CA made before it had only the DNS constraint).
func fullyConstrained(c *x509.Certificate) bool {
	var v4, v6 bool
	for _, r := range c.ExcludedIPRanges {
		ones, bits := r.Mask.Size()
		v4 = v4 || ones == 0 && bits == 32
		v6 = v6 || ones == 0 && bits == 128
	}
	return v4 && v6 &&
		len(c.PermittedEmailAddresses) == 1 && c.PermittedEmailAddresses[0] == noName &&
		len(c.PermittedURIDomains) == 1 && c.PermittedURIDomains[0] == noName
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

// Issue makes a certificate for *.domain and domain, valid from now for
// 90 days, with a fresh key.
func (ca *CA) Issue(domain string, now time.Time) (*tls.Certificate, error) {
	if !ca.Permits(domain) {
		return nil, fmt.Errorf("the local CA %s may not issue for %s", ca.Path, domain)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{Organization: []string{"agentenv"}, CommonName: "*." + domain},
		DNSNames:     []string{"*." + domain, domain},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

// Source hands the proxy its certificate at each handshake.
type Source struct {
	domain string
	ca     *CA // nil: an operator's certificate
	now    func() time.Time

	mu   sync.Mutex
	cert *tls.Certificate
}

// FromCA returns a source of certificates the CA issues for the domain,
// renewed 30 days before they end.
func FromCA(ca *CA, domain string, now func() time.Time) (*Source, error) {
	if now == nil {
		now = time.Now
	}
	s := &Source{domain: domain, ca: ca, now: now}
	if _, err := s.current(); err != nil {
		return nil, err
	}
	return s, nil
}

// FromFiles loads an operator's certificate (PEM, its chain after it) and
// key; the certificate must cover <port>-<id>.<domain>, that is *.domain.
func FromFiles(certFile, keyFile, domain string) (*Source, error) {
	if err := CheckDomain(domain); err != nil {
		return nil, err
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--proxy-tls-cert/--proxy-tls-key: %w", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("--proxy-tls-cert %s: %w", certFile, err)
	}
	pair.Leaf = leaf
	if err := leaf.VerifyHostname("49983-x." + domain); err != nil {
		return nil, fmt.Errorf("--proxy-tls-cert %s does not cover *.%s (sandbox hosts are <port>-<sandboxID>.%s): %w", certFile, domain, domain, err)
	}
	if time.Now().After(leaf.NotAfter) {
		return nil, fmt.Errorf("--proxy-tls-cert %s expired on %s", certFile, leaf.NotAfter.Format(time.RFC3339))
	}
	return &Source{domain: domain, cert: &pair, now: time.Now}, nil
}

func (s *Source) current() (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ca != nil && (s.cert == nil || s.now().Add(renewBefore).After(s.cert.Leaf.NotAfter)) {
		c, err := s.ca.Issue(s.domain, s.now())
		if err != nil {
			return nil, err
		}
		s.cert = c
	}
	return s.cert, nil
}

// TLSConfig is the proxy's TLS configuration (HTTP/1.1 only: the proxy
// streams and upgrades connections, which HTTP/2 would change).
func (s *Source) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return s.current()
		},
	}
}

// HostPort joins a domain and the port clients reach the TLS proxy on,
// as the create answer's domain: E2B's SDKs put it after
// "<port>-<sandboxID>." and use https, so the port is left out only
// when it is 443.
func HostPort(domain, listenAddr string) string {
	_, port, err := net.SplitHostPort(listenAddr)
	if err != nil || port == "443" {
		return domain
	}
	return net.JoinHostPort(domain, port)
}

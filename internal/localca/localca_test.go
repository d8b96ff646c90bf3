package localca

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func pool(t *testing.T, path string) *x509.CertPool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		t.Fatalf("%s holds no certificate", path)
	}
	return p
}

func verify(c *tls.Certificate, roots *x509.CertPool, name string) error {
	inter := x509.NewCertPool()
	for _, der := range c.Certificate[1:] {
		ic, _ := x509.ParseCertificate(der)
		inter.AddCert(ic)
	}
	_, err := c.Leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: name})
	return err
}

// TestLocalCA: made once with its modes, loaded again unchanged, refused
// for another domain; what it issues verifies for <port>-<id>.<domain>
// only, and nothing it could sign for another name verifies.
func TestLocalCA(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadOrCreate(dir, "agentenv.localhost", nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{CertFile: 0o644, KeyFile: 0o600} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s: mode %o, want %o", name, got, want)
		}
	}
	again, err := LoadOrCreate(dir, "agentenv.localhost", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !again.cert.Equal(ca.cert) {
		t.Error("a second start made a new CA; clients would have to trust it again")
	}
	if _, err := LoadOrCreate(dir, "other.test", nil); err == nil || !strings.Contains(err.Error(), "remove ca.pem") {
		t.Errorf("CA for another domain: err %v, want a refusal saying what to remove", err)
	}

	roots := pool(t, filepath.Join(dir, CertFile))
	leaf, err := ca.Issue("agentenv.localhost", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for name, ok := range map[string]bool{
		"49983-i0123.agentenv.localhost": true,
		"agentenv.localhost":             true,
		"a.b.agentenv.localhost":         false, // a wildcard covers one label
		"example.com":                    false,
	} {
		if err := verify(leaf, roots, name); (err == nil) != ok {
			t.Errorf("verify for %s: err %v, want ok=%v", name, err, ok)
		}
	}
	if _, err := ca.Issue("example.com", time.Now()); err == nil {
		t.Error("the CA issued for a domain outside its constraint")
	}
	// Even a certificate its key signs for another name fails: the
	// constraint is in the CA certificate clients trust.
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "example.com"}, DNSNames: []string{"example.com"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	rogue, _ := x509.ParseCertificate(der)
	if _, err := rogue.Verify(x509.VerifyOptions{Roots: roots, DNSName: "example.com"}); err == nil {
		t.Error("a certificate for example.com signed by the local CA verifies; the name constraint is missing")
	}
}

// TestSourceRenews: the certificate is replaced 30 days before its end.
func TestSourceRenews(t *testing.T) {
	ca, err := LoadOrCreate(t.TempDir(), "agentenv.localhost", nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	s, err := FromCA(ca, "agentenv.localhost", func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	first, _ := s.current()
	now = now.Add(59 * 24 * time.Hour)
	if c, _ := s.current(); c != first {
		t.Error("renewed with 31 days left")
	}
	now = now.Add(2 * 24 * time.Hour)
	c, _ := s.current()
	if c == first || !c.Leaf.NotAfter.After(now.Add(renewBefore)) {
		t.Errorf("not renewed with 29 days left (ends %s)", c.Leaf.NotAfter)
	}
}

// TestFromFiles: an operator's certificate must cover *.domain.
func TestFromFiles(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadOrCreate(dir, "agentenv.localhost", nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ca.Issue("agentenv.localhost", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "op.pem"), filepath.Join(dir, "op-key.pem")
	var chain []byte
	for _, der := range c.Certificate {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	os.WriteFile(certFile, chain, 0o644)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600)
	if _, err := FromFiles(certFile, keyFile, "agentenv.localhost"); err != nil {
		t.Errorf("a certificate of *.agentenv.localhost: %v", err)
	}
	if _, err := FromFiles(certFile, keyFile, "sandboxes.example.com"); err == nil || !strings.Contains(err.Error(), "does not cover *.sandboxes.example.com") {
		t.Errorf("a certificate of another domain: err %v, want it refused", err)
	}
	if _, err := FromFiles(keyFile, certFile, "agentenv.localhost"); err == nil {
		t.Error("swapped files accepted")
	}
}

func TestCheckDomain(t *testing.T) {
	for d, ok := range map[string]bool{
		"agentenv.localhost": true, "sandbox.example.com": true, "a-b.c": true,
		"": false, "localhost": false, "x.localhost:3443": false, "https://x.y": false, "*.x.y": false,
		"x..y": false, "-x.y": false, "x_y.z": false,
	} {
		if err := CheckDomain(d); (err == nil) != ok {
			t.Errorf("CheckDomain(%q) = %v, want ok=%v", d, err, ok)
		}
	}
}

// TestConcurrentCreate: servers starting at once on one directory end
// with one CA, the one on disk.
func TestConcurrentCreate(t *testing.T) {
	dir := t.TempDir()
	const n = 8
	cas := make([]*CA, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cas[i], errs[i] = LoadOrCreate(dir, "agentenv.localhost", nil)
		}()
	}
	wg.Wait()
	disk, err := load(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("start %d: %v", i, errs[i])
		}
		if !cas[i].cert.Equal(disk.cert) {
			t.Errorf("start %d uses a CA that is not the one in %s", i, CertFile)
		}
	}
}

// signLeaf has the CA's key sign a leaf certificate for whatever names
// tmpl carries, as anyone who read ca-key.pem could.
func signLeaf(t *testing.T, ca *CA, tmpl *x509.Certificate) *x509.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl.SerialNumber = serial()
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageEmailProtection}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// opensslVerify runs `openssl verify` of leaf against caFile; ok is false
// with openssl's output when it refuses.
func opensslVerify(t *testing.T, caFile string, leaf *x509.Certificate) (ok bool, out string) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "leaf.pem")
	if err := os.WriteFile(f, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := exec.Command("openssl", "verify", "-CAfile", caFile, f).CombinedOutput()
	return err == nil, string(b)
}

// TestLocalCASignsNoAddresses: the CA's constraint covers every kind of
// name a client checks, so its key cannot make a certificate a client
// accepts for an IP address, an email address or a URI (a CA with only a
// DNS constraint leaves those open). Checked with Go's verifier and, when
// it is installed, openssl's.
func TestLocalCASignsNoAddresses(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadOrCreate(dir, "agentenv.localhost", nil)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, CertFile)
	roots := pool(t, caFile)
	_, noOpenSSL := exec.LookPath("openssl")
	mustURL := func(s string) *url.URL {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	in := "49983-i0123.agentenv.localhost"
	for _, c := range []struct {
		name string
		tmpl x509.Certificate
		ok   bool
	}{
		{"DNS name under the domain", x509.Certificate{DNSNames: []string{in}}, true},
		{"IPv4 only", x509.Certificate{IPAddresses: []net.IP{net.ParseIP("10.0.0.1").To4()}}, false},
		{"IPv4 as IPv6", x509.Certificate{IPAddresses: []net.IP{net.ParseIP("10.0.0.1").To16()}}, false},
		{"IPv6 only", x509.Certificate{IPAddresses: []net.IP{net.ParseIP("::1")}}, false},
		{"DNS name and IPv4", x509.Certificate{DNSNames: []string{in}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1").To4()}}, false},
		{"email only", x509.Certificate{EmailAddresses: []string{"admin@example.com"}}, false},
		{"email at the domain", x509.Certificate{EmailAddresses: []string{"admin@agentenv.localhost"}}, false},
		{"URI only", x509.Certificate{URIs: []*url.URL{mustURL("https://example.com/")}}, false},
		{"URI under the domain", x509.Certificate{URIs: []*url.URL{mustURL("spiffe://x.agentenv.localhost/y")}}, false},
	} {
		leaf := signLeaf(t, ca, &c.tmpl)
		_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		if got := err == nil; got != c.ok {
			t.Errorf("%s: Go verify err %v, want ok=%v", c.name, err, c.ok)
		}
		if noOpenSSL == nil {
			if got, out := opensslVerify(t, caFile, leaf); got != c.ok {
				t.Errorf("%s: openssl verify ok=%v, want %v: %s", c.name, got, c.ok, out)
			}
		}
	}
}

// TestOldCAReplaced: a CA made with the DNS constraint alone is replaced
// at start (the server keeps starting, and says clients must trust the
// new ca.pem), its key is gone, and an IP certificate it signed does not
// verify against the new one.
func TestOldCAReplaced(t *testing.T) {
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "old agentenv local CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true, MaxPathLenZero: true,
		PermittedDNSDomainsCritical: true, PermittedDNSDomains: []string{"agentenv.localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600)
	os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	old, err := load(certPath, keyPath)
	if err != nil {
		t.Fatal(err)
	}
	rogue := signLeaf(t, old, &x509.Certificate{IPAddresses: []net.IP{net.ParseIP("10.0.0.1").To4()}})
	if _, err := rogue.Verify(x509.VerifyOptions{Roots: pool(t, certPath)}); err != nil {
		t.Fatalf("the old CA's IP certificate does not verify against it (%v): the test does not show what it means to", err)
	}

	var logged bytes.Buffer
	ca, err := LoadOrCreate(dir, "agentenv.localhost", slog.New(slog.NewTextHandler(&logged, nil)))
	if err != nil {
		t.Fatalf("start with an old CA: %v", err)
	}
	if ca.cert.Equal(old.cert) || !fullyConstrained(ca.cert) {
		t.Fatal("the old CA was kept")
	}
	if !strings.Contains(logged.String(), "clients must trust the new ca.pem") {
		t.Errorf("log %q does not tell clients to trust the new ca.pem", logged.String())
	}
	kb, _ := os.ReadFile(keyPath)
	if bytes.Equal(kb, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})) {
		t.Error("the old key is still in ca-key.pem")
	}
	if _, err := rogue.Verify(x509.VerifyOptions{Roots: pool(t, certPath)}); err == nil {
		t.Error("the old CA's IP certificate verifies against the new ca.pem")
	}
	logged.Reset()
	again, err := LoadOrCreate(dir, "agentenv.localhost", slog.New(slog.NewTextHandler(&logged, nil)))
	if err != nil || !again.cert.Equal(ca.cert) || logged.Len() != 0 {
		t.Errorf("second start: err %v, same CA %v, log %q; want the new CA kept quietly", err, err == nil && again.cert.Equal(ca.cert), logged.String())
	}
}

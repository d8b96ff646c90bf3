package secret_test

import (
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/fleet/secret"
)

func TestRPCAuth(t *testing.T) {
	a := secret.NewAuth("test-secret-0123456789abcdef")
	req := httptest.NewRequest(http.MethodPost, "http://node/fleet/v1/List", nil)
	if a.Verify(req) {
		t.Fatal("a request without the header verified")
	}
	a.Sign(req)
	if !a.Verify(req) {
		t.Fatal("a signed request did not verify")
	}
	if strings.Contains(req.Header.Get(secret.AuthHeader), "test-secret") {
		t.Fatal("the header carries the secret")
	}
	if secret.NewAuth("another-secret-0123456789").Verify(req) {
		t.Fatal("verified with another secret")
	}
	other := httptest.NewRequest(http.MethodPost, "http://node/fleet/v1/Kill", nil)
	other.Header.Set(secret.AuthHeader, req.Header.Get(secret.AuthHeader))
	if a.Verify(other) {
		t.Fatal("a header made for List verified for Kill")
	}
	old := httptest.NewRequest(http.MethodPost, "http://node/fleet/v1/List", nil)
	ts := time.Now().Add(-2 * secret.Skew).Unix()
	old.Header.Set(secret.AuthHeader, strings.Join([]string{itoa(ts), b64(a.MAC(itoa(ts), "POST", "/fleet/v1/List"))}, "."))
	if a.Verify(old) {
		t.Fatal("a header older than the allowed skew verified")
	}
}

// Whoever reaches etcd without the cluster secret can write keys, but
// nothing written so steers the fleet: a node record with a huge
// capacity, a cordon of the real node and a sandbox record pointing at
// the forged node are ignored, and creates still land on the real node.
func itoa(n int64) string { return strconv.FormatInt(n, 10) }
func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

package store

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/fleet/secret"
	"github.com/agentenv/agentenv/internal/sandbox"
)

var testSeal = secret.NewSealer("test-secret-0123456789abcdef")

func TestSealedRecords(t *testing.T) {
	rec := RecordOf("n1", sandbox.Sandbox{ID: "i1", AccessToken: "tok-0123456789", EnvVars: map[string]string{"K": "secret-value"}, Metadata: map[string]string{"k": "meta-0123456789"}})
	val, err := testSeal.Seal(SandboxPrefix+"i1", rec)
	if err != nil {
		t.Fatal(err)
	}
	// Only strings long enough not to turn up in random base64 by chance.
	for _, clear := range []string{"tok-0123456789", "secret-value", "meta-0123456789", `"node"`} {
		if strings.Contains(val, clear) {
			t.Errorf("sealed record holds %q in clear: %s", clear, val)
		}
	}
	var got SandboxRecord
	if err := testSeal.Open(SandboxPrefix+"i1", []byte(val), &got); err != nil || got.Sandbox.Metadata["k"] != "meta-0123456789" {
		t.Fatalf("open: %+v, %v; want the record back", got, err)
	}
	// Tokens and env vars are the node's: not in etcd at all, sealed or not.
	if plain, _ := json.Marshal(got); strings.Contains(string(plain), "tok-0123456789") || strings.Contains(string(plain), "secret-value") {
		t.Errorf("the etcd record holds a token or an env var: %s", plain)
	}
	plain, _ := json.Marshal(rec)
	tampered := []byte(val)
	tampered[len(tampered)-3] ^= 1
	for _, c := range []struct {
		name, key string
		val       []byte
		seal      *secret.Sealer
	}{
		{"plain JSON (written without the secret)", SandboxPrefix + "i1", plain, testSeal},
		{"moved to another key", SandboxPrefix + "i2", []byte(val), testSeal},
		{"tampered", SandboxPrefix + "i1", tampered, testSeal},
		{"another fleet's secret", SandboxPrefix + "i1", []byte(val), secret.NewSealer("another-secret-0123456789")},
		{"empty", SandboxPrefix + "i1", nil, testSeal},
		{"prefix only", SandboxPrefix + "i1", []byte(secret.SealPrefix), testSeal},
	} {
		var r SandboxRecord
		if err := c.seal.Open(c.key, c.val, &r); !errors.Is(err, secret.ErrUnsealed) {
			t.Errorf("%s: open gave %v, want secret.ErrUnsealed", c.name, err)
		}
	}
}

package api

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	wire "github.com/agentenv/agentenv/client/api"
	"github.com/agentenv/agentenv/internal/errdefs"
)

// FuzzRequestBodies feeds arbitrary bodies to the JSON decoding of the
// create, network-update and template-build requests: decoding never
// panics, and every failure is a client error (4xx), never a 500.
func FuzzRequestBodies(f *testing.F) {
	for _, s := range []string{
		`{"templateID":"busybox","timeout":30,"metadata":{"k":"v"},"envVars":{"A":"1"},"network":{"allowOut":["10.0.0.0/8"],"allowPublicTraffic":false}}`,
		`{"allowOut":["1.2.3.4"],"denyOut":["0.0.0.0/0"],"allow_internet_access":false}`,
		`{"name":"x","debian":"bookworm","packages":["python3"],"mirror":"http://x"}`,
		`{"templateID":`, `[]`, `null`, `{"timeout":-1}`, `{"timeout":1e309}`, "\x00",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		targets := []any{new(wire.NewSandbox), new(wire.NetworkUpdate), new(struct {
			Name     string   `json:"name"`
			Packages []string `json:"packages"`
		})}
		for _, v := range targets {
			r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(string(body)))
			err := decode(httptest.NewRecorder(), r, v)
			if err != nil && !errors.Is(err, errdefs.ErrInvalid) && !errors.Is(err, errdefs.ErrTooLarge) {
				t.Fatalf("decode(%q) = %v, want a client error", body, err)
			}
			if cr, ok := v.(*wire.NewSandbox); ok && err == nil {
				n := toNetwork(cr.AllowInternetAccess, cr.Network)
				if n == nil {
					t.Fatal("toNetwork returned nil")
				}
				if cr.Timeout != nil {
					if _, err := seconds(*cr.Timeout, "timeout"); err != nil && !errors.Is(err, errdefs.ErrInvalid) {
						t.Fatalf("seconds: %v", err)
					}
				}
			}
		}
	})
}

// FuzzListQuery feeds arbitrary query strings to the list filter parsing
// (the SDK's double-escaped metadata filter and the state list).
func FuzzListQuery(f *testing.F) {
	for _, s := range []string{"metadata=" + url.QueryEscape("a=b&c=d"), "state=running,paused", "metadata=%zz", "state=", "metadata=a%3D%25"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		if m := q.Get("metadata"); m != "" {
			md, err := parseMetadata(m)
			if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("parseMetadata(%q) = %v, want ErrInvalid", m, err)
			}
			if err == nil && md == nil {
				t.Fatalf("parseMetadata(%q) = nil map without error", m)
			}
		}
	})
}

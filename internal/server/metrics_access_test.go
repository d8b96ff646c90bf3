package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestMetricsNeedKey: /metrics counts every key's sandboxes by template,
// so it answers the operator and the single key only: a keyless caller
// gets 401 and a named key 403, with no series in either answer.
func TestMetricsNeedKey(t *testing.T) {
	e := sharedServer(t)
	for _, tc := range []struct {
		who, key string
		want     int
	}{
		{"no key", "", http.StatusUnauthorized},
		{"a wrong key", "not-a-key-0123456789", http.StatusUnauthorized},
		{"a named key", aliceKey, http.StatusForbidden},
		{"the operator key", operatorKey, http.StatusOK},
		{"the single key", e.key, http.StatusOK},
	} {
		req, _ := http.NewRequest("GET", e.api+"/metrics", nil)
		if tc.key != "" {
			req.Header.Set("Authorization", "Bearer "+tc.key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("GET /metrics with %s: got HTTP %d, want %d: %.200s", tc.who, resp.StatusCode, tc.want, b)
		}
		if leaked := strings.Contains(string(b), "agentenv_sandboxes"); leaked != (tc.want == http.StatusOK) {
			t.Errorf("GET /metrics with %s: series in the answer %v, want %v", tc.who, leaked, tc.want == http.StatusOK)
		}
	}
}

package metrics_test

import (
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/metrics"
)

func scrapeOutcomes(t *testing.T, reg *metrics.Registry) string {
	t.Helper()
	rec := httptest.NewRecorder()
	reg.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

// TestExecResultsLabelBound: the operator's metadata label keeps at most
// its bound of distinct values; later ones count as "other".
func TestExecResultsLabelBound(t *testing.T) {
	reg := metrics.New("serve")
	if err := reg.SetLabelKey("run", 2); err != nil {
		t.Fatal(err)
	}
	runs := map[string]string{"a": "r1", "b": "r2", "c": "r3", "d": "r4"}
	reg.SetMetadata(func(id string) map[string]string { return map[string]string{"run": runs[id]} })
	for _, id := range []string{"a", "b", "c", "d", "a"} {
		reg.ObserveExec(metrics.ExecOK, id)
	}
	reg.ObserveSandboxEnd(metrics.EndKilled, map[string]string{"run": "r9"})
	out := scrapeOutcomes(t, reg)
	for _, want := range []string{
		`agentenv_exec_results_total{result="ok",role="serve",run="r1"} 2`,
		`agentenv_exec_results_total{result="ok",role="serve",run="r2"} 1`,
		`agentenv_exec_results_total{result="ok",role="serve",run="other"} 2`,
		`agentenv_sandbox_ends_total{cause="killed",role="serve",run="other"} 1`,
		`agentenv_exec_results_total{result="timeout",role="serve",run=""} 0`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("got no %s in:\n%s", want, grepLines(out, "agentenv_exec_results_total", "agentenv_sandbox_ends_total"))
		}
	}
}

func TestSetLabelKeyRejectsBadNames(t *testing.T) {
	for _, k := range []string{"result", "role", "9run", "a-b", "_x"} {
		if err := metrics.New("serve").SetLabelKey(k, 0); err == nil {
			t.Errorf("SetLabelKey(%q): got nil error, want one", k)
		}
	}
}

func grepLines(s string, prefixes ...string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				fmt.Fprintln(&b, l)
			}
		}
	}
	return b.String()
}

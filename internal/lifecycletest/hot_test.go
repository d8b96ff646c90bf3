package lifecycletest

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/envdapi"
	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/server"
)

// TestUnprivilegedHotHandout: a create of the template's size takes the
// hot pool's sandbox through the hot boot's named steps; it runs with a
// token and environment of its own, and the pool refills. A handout that
// fails at a step (envd refuses the pooled token) undoes what it did and
// kills the pooled sandbox, and the create gets another sandbox;
// nothing of either is left at the end (newHost's cleanup checks).
func TestUnprivilegedHotHandout(t *testing.T) {
	x := newHost(t, func(c *server.Config) { c.Limits.HotPool = 1 })
	pooled := x.pooled()
	sb := x.create(sandbox.CreateRequest{EnvVars: map[string]string{"HANDED": "out"}, Metadata: map[string]string{"k": "v"}})
	if sb.ID != pooled.ID {
		t.Fatalf("create got %s, want the pooled %s", sb.ID, pooled.ID)
	}
	if sb.Boot == nil || sb.Boot.Kind != sandbox.BootHot {
		t.Fatalf("boot record %+v, want kind %q", sb.Boot, sandbox.BootHot)
	}
	var steps []string
	for _, s := range sb.Boot.Steps {
		steps = append(steps, s.Step)
	}
	if want := []string{"claim", "egress", "rekey", "running"}; !slices.Equal(steps, want) {
		t.Errorf("hot boot steps %v, want %v", steps, want)
	}
	if sb.State != sandbox.StateRunning || sb.Metadata["k"] != "v" || sb.AccessToken == pooled.AccessToken {
		t.Errorf("handed out: state %s, metadata %v, token changed %v; want running, the request's metadata, a new token",
			sb.State, sb.Metadata, sb.AccessToken != pooled.AccessToken)
	}
	if code, _ := envs(sb, pooled.AccessToken); code != http.StatusUnauthorized {
		t.Errorf("envd with the pooled token after the handout: HTTP %d, want 401", code)
	}
	if code, env := envs(sb, sb.AccessToken); code != http.StatusOK || env["HANDED"] != "out" {
		t.Errorf("envd with the sandbox's token: HTTP %d, envs %v; want 200 with HANDED=out", code, env)
	}

	// The pool refills; its next sandbox's envd is given another token,
	// so the handout's rekey step fails.
	next := x.pooled()
	if next.ID == sb.ID {
		t.Fatalf("the pool offers %s, which was handed out", sb.ID)
	}
	if code := rotate(next, next.AccessToken, "not-the-pools"); code/100 != 2 {
		t.Fatalf("rotate the pooled envd's token: HTTP %d", code)
	}
	// The create boots, or takes the sandbox the pool made meanwhile.
	booted := x.create(sandbox.CreateRequest{})
	if booted.ID == next.ID || booted.Boot == nil || booted.State != sandbox.StateRunning {
		t.Fatalf("create after a failed handout: %s (%s), boot %+v; want a running sandbox other than %s", booted.ID, booted.State, booted.Boot, next.ID)
	}
	if err := health(booted); err != nil {
		t.Fatalf("envd of the booted sandbox: %v", err)
	}
	eventually(t, "the sandbox whose handout failed is killed", func() bool { return x.state(next.ID) == "gone" })
	if _, err := x.m.Get(next.ID); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("get of the sandbox whose handout failed: %v, want it killed", err)
	}
	eventually(t, "the runtime forgets it", func() bool { return x.fakeState(next.ID) == runtime.StatusUnknown })
}

// pooled waits for the hot pool's sandbox of busybox (booted, and in the
// pool: a create can take it).
func (x *host) pooled() sandbox.Sandbox {
	x.t.Helper()
	var sb sandbox.Sandbox
	eventually(x.t, "a pooled sandbox", func() bool {
		l := x.m.List(sandbox.Filter{States: []sandbox.State{sandbox.StatePooled}})
		if len(l) != 1 || x.m.Pools().Hot["busybox"] != 1 {
			return false
		}
		sb = l[0]
		return true
	})
	return sb
}

// envs asks sb's envd for its environment with token.
func envs(sb sandbox.Sandbox, token string) (int, map[string]string) {
	req, _ := http.NewRequest(http.MethodGet, "http://"+sb.Addr(envdapi.Port)+"/envs", nil)
	req.Header.Set("X-Access-Token", token)
	resp, err := (&http.Client{Timeout: 15 * time.Second}).Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	var env map[string]string
	json.NewDecoder(resp.Body).Decode(&env)
	return resp.StatusCode, env
}

// rotate gives sb's envd the token to, as the manager's rekey does.
func rotate(sb sandbox.Sandbox, token, to string) int {
	req, _ := http.NewRequest(http.MethodPost, "http://"+sb.Addr(envdapi.Port)+"/init", strings.NewReader(`{"accessToken":"`+to+`"}`))
	req.Header.Set("X-Access-Token", token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 15 * time.Second}).Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

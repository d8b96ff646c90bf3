package server_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
)

// orphanChurn starts n shells that each leave a short sleep behind and
// exit, as model-written code does: each sleep's parent is gone, so it is
// envd's (PID 1's) to reap. It exits 9 at the first fork that fails.
func orphanChurn(n int) string {
	return fmt.Sprintf(`i=0; while [ $i -lt %d ]; do sh -c "sleep 0.1 &" || exit 9; i=$((i+1)); done`, n)
}

// zombies counts the sandbox's zombie processes.
const zombies = `n=0; for f in /proc/[0-9]*/status; do grep -q '^State:[[:space:]]*Z' "$f" 2>/dev/null && n=$((n+1)); done; echo $n`

// TestOrphansReaped: after 600 orphaned children, commands still start
// and no zombie is left: envd reaps what is reparented to it. Without it,
// every fork fails once the zombies fill the sandbox's process cap.
func TestOrphansReaped(t *testing.T) {
	e := sharedServer(t)
	for _, tpl := range filesTemplates(t, e) {
		t.Run(tpl, func(t *testing.T) {
			sb := e.create(t, client.CreateRequest{TemplateID: tpl, Timeout: new(int64(300))})
			if res := e.sh(t, sb, orphanChurn(600)); res.ExitCode != 0 {
				t.Fatalf("600 orphaned sleeps: exit %d: %s", res.ExitCode, res.Stderr)
			}
			if res := e.sh(t, sb, "echo still"); res.ExitCode != 0 || string(res.Stdout) != "still\n" {
				t.Fatalf("a command after the orphans: exit %d, stdout %q, stderr %q; want still", res.ExitCode, res.Stdout, res.Stderr)
			}
			// The last sleeps end 0.1 s after their shells: poll (a
			// safety net of 30 s, not a measurement).
			var left string
			for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
				if left = strings.TrimSpace(string(e.sh(t, sb, zombies).Stdout)); left == "0" {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if left != "0" {
				t.Errorf("%s zombies left in the sandbox, want 0", left)
			}
		})
	}
}

// TestExitCodesUnderOrphanChurn: while orphans are reaped around them,
// envd's own commands keep their exit codes (a reaper that took any child
// would leave them with none).
func TestExitCodesUnderOrphanChurn(t *testing.T) {
	e := sharedServer(t)
	sb := e.create(t, client.CreateRequest{Timeout: new(int64(300))})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := e.client.Exec(ctx, sb, "/bin/sh", []string{"-c", orphanChurn(50)}, nil, nil); err != nil && ctx.Err() == nil {
					t.Errorf("churn: %v", err)
					return
				}
			}
		})
	}
	for i := range 40 {
		want := i%5 + 1
		res, err := e.client.Exec(ctx, sb, "/bin/sh", []string{"-c", fmt.Sprintf("sh -c 'sleep 0.01 &'; exit %d", want)}, nil, nil)
		if err != nil {
			t.Fatalf("command %d: %v", i, err)
		}
		if res.ExitCode != want {
			t.Errorf("command %d: exit %d, want %d (stderr %q)", i, res.ExitCode, want, res.Stderr)
		}
	}
	close(stop)
	wg.Wait()
}

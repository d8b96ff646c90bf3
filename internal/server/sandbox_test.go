package server_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
)

func TestSandboxLifecycle(t *testing.T) {
	e := sharedServer(t)
	ctx := context.Background()
	sb := e.create(t, client.CreateRequest{EnvVars: map[string]string{"GREETING": "hello"}, Metadata: map[string]string{"test": "lifecycle"}})

	res := e.sh(t, sb, `echo "$GREETING"; id -un; pwd; echo oops >&2; exit 5`)
	if got, want := string(res.Stdout), "hello\nuser\n/home/user\n"; got != want {
		t.Errorf("stdout = %q, want %q", got, want)
	}
	if got, want := string(res.Stderr), "oops\n"; got != want {
		t.Errorf("stderr = %q, want %q", got, want)
	}
	if res.ExitCode != 5 {
		t.Errorf("exit code = %d, want 5", res.ExitCode)
	}

	data := make([]byte, 3<<20)
	rand.Read(data)
	if err := e.client.WriteFile(ctx, sb, "/tmp/blob.bin", bytes.NewReader(data)); err != nil {
		t.Fatalf("write file: %v", err)
	}
	got, err := e.client.ReadFile(ctx, sb, "/tmp/blob.bin")
	if err != nil {
		t.Fatalf("read file: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes, differing from the %d written", len(got), len(data))
	}

	list, err := e.client.ListSandboxes(ctx, map[string]string{"test": "lifecycle"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].SandboxID != sb.SandboxID {
		t.Errorf("list by metadata = %v, want just %s", list, sb.SandboxID)
	}
	if err := e.client.SetTimeout(ctx, sb.SandboxID, 3600); err != nil {
		t.Fatalf("set timeout: %v", err)
	}
	info, err := e.client.GetSandbox(ctx, sb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(info.EndAt); d < 59*time.Minute || d > 61*time.Minute {
		t.Errorf("after set timeout 3600s, endAt is %v away, want about 1h", d)
	}

	if err := e.client.KillSandbox(ctx, sb.SandboxID); err != nil {
		t.Fatalf("kill: %v", err)
	}
	if _, err := e.client.GetSandbox(ctx, sb.SandboxID); !isStatus(err, 404) {
		t.Errorf("get after kill: err = %v, want 404", err)
	}
	if left := e.leftovers(sb, ""); len(left) > 0 {
		t.Errorf("after kill, still on the host: %v", left)
	}
}

func TestSandboxTimeoutKills(t *testing.T) {
	e := sharedServer(t)
	sb := e.create(t, client.CreateRequest{Timeout: new(int64(1))})
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := e.client.GetSandbox(context.Background(), sb.SandboxID)
		if isStatus(err, 404) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox with timeout 1s still exists after 20s (err=%v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if left := e.leftovers(sb, ""); len(left) > 0 {
		t.Errorf("after timeout, still on the host: %v", left)
	}
}

func TestConcurrentCreate(t *testing.T) {
	e := sharedServer(t)
	const n = 20
	ctx := context.Background()
	sbs := make([]client.Sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := e.client.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Metadata: map[string]string{"test": "concurrent"}})
			if err != nil {
				errs[i] = err
				return
			}
			sbs[i] = sb
			res, err := e.client.Exec(ctx, sb, "/bin/sh", []string{"-c", fmt.Sprintf("echo %d", i)}, nil, nil)
			if err == nil && strings.TrimSpace(string(res.Stdout)) != fmt.Sprint(i) {
				err = fmt.Errorf("stdout %q, want %d", res.Stdout, i)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("sandbox %d: %v", i, err)
		}
	}
	for _, sb := range sbs {
		if sb.SandboxID != "" {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := e.client.KillSandbox(ctx, sb.SandboxID); err != nil {
					t.Errorf("kill %s: %v", sb.SandboxID, err)
				}
			}()
		}
	}
	wg.Wait()
	for _, sb := range sbs {
		if left := e.leftovers(sb, ""); len(left) > 0 {
			t.Errorf("sandbox %s left behind: %v", sb.SandboxID, left)
		}
	}
	if remaining, _ := e.client.ListSandboxes(ctx, map[string]string{"test": "concurrent"}); len(remaining) > 0 {
		t.Errorf("%d sandboxes still listed after kill", len(remaining))
	}
}

func isStatus(err error, status int) bool {
	ce, ok := err.(*client.Error)
	return ok && ce.Status == status
}

package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
)

// TestForkRacesSnapshotsAndKills runs forks (whose children take warm
// containers, see internal/sandbox/warm.go), snapshots, restores and kills
// of the same sandboxes at once: forks of parents that are being
// snapshotted, children killed while their siblings run commands, a parent
// killed while it is being forked, all while the warm pool refills. Every
// request must succeed (or, for the parent killed mid-fork, fail as
// not found / conflict), every child must run a command, and nothing of any
// sandbox may be left afterwards. Run it with -race: the warm pool and the
// runtime's dispatch are shared by all of it.
func TestForkRacesSnapshotsAndKills(t *testing.T) {
	e := sharedServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const rounds = 4

	var (
		mu  sync.Mutex
		ids []string
	)
	made := func(id string) {
		mu.Lock()
		ids = append(ids, id)
		mu.Unlock()
	}
	newParent := func() client.Sandbox {
		sb := e.create(t, client.CreateRequest{Timeout: new(int64(300)), Metadata: map[string]string{"test": "fork-race"}})
		made(sb.SandboxID)
		return sb
	}
	parents := []client.Sandbox{newParent(), newParent()}
	// The first forks must find warm containers to take (the shared
	// server keeps 2 for the ready busybox template).
	for deadline := time.Now().Add(30 * time.Second); e.warmContainers() == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no warm container after 30s")
		}
	}

	// forkAndRun forks sb into n, runs a command in each child while
	// killing them one after another, and reports what failed.
	forkAndRun := func(sb client.Sandbox, n int) error {
		kids, errs, err := e.client.ForkSandbox(ctx, sb.SandboxID, n)
		if err != nil {
			return fmt.Errorf("fork %s: %w", sb.SandboxID, err)
		}
		var all []error
		var wg sync.WaitGroup
		for i, c := range kids {
			if errs[i] != nil {
				all = append(all, fmt.Errorf("child %d: %w", i, errs[i]))
				continue
			}
			made(c.SandboxID)
			wg.Go(func() {
				// A child restored into a warm container is a sandbox like
				// any other: a restart must adopt it, not remove it.
				if _, err := os.Stat(filepath.Join(e.dataDir, "sandboxes", c.SandboxID, "warm")); err == nil {
					mu.Lock()
					all = append(all, fmt.Errorf("child %s still carries the warm-container marker", c.SandboxID))
					mu.Unlock()
				}
				res, err := e.client.Exec(ctx, c, "/bin/sh", []string{"-c", "echo " + c.SandboxID}, nil, nil)
				if err == nil && (res.ExitCode != 0 || string(res.Stdout) != c.SandboxID+"\n") {
					err = fmt.Errorf("got %q exit %d", res.Stdout, res.ExitCode)
				}
				if err != nil {
					mu.Lock()
					all = append(all, fmt.Errorf("exec in child %s: %w", c.SandboxID, err))
					mu.Unlock()
				}
				if err := e.client.KillSandbox(ctx, c.SandboxID); err != nil {
					mu.Lock()
					all = append(all, fmt.Errorf("kill child %s: %w", c.SandboxID, err))
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return errors.Join(all...)
	}

	var wg sync.WaitGroup
	errc := make(chan error, 64)
	// Two forkers per parent, of different sizes.
	for _, p := range parents {
		for _, n := range []int{4, 2} {
			wg.Go(func() {
				for range rounds {
					if err := forkAndRun(p, n); err != nil {
						errc <- err
					}
				}
			})
		}
	}
	// A snapshotter per parent: snapshot, restore it, run, kill, delete.
	for _, p := range parents {
		wg.Go(func() {
			for range rounds {
				sn, err := e.client.SnapshotSandbox(ctx, p.SandboxID, "", nil)
				if err != nil {
					errc <- fmt.Errorf("snapshot %s: %w", p.SandboxID, err)
					continue
				}
				sb, err := e.client.CreateSandbox(ctx, client.CreateRequest{TemplateID: sn.SnapshotID, Timeout: new(int64(60))})
				if err != nil {
					errc <- fmt.Errorf("restore %s: %w", sn.SnapshotID, err)
				} else {
					made(sb.SandboxID)
					if _, err := e.client.Exec(ctx, sb, "/bin/true", nil, nil, nil); err != nil {
						errc <- fmt.Errorf("exec in restored %s: %w", sb.SandboxID, err)
					}
					if err := e.client.KillSandbox(ctx, sb.SandboxID); err != nil {
						errc <- fmt.Errorf("kill restored %s: %w", sb.SandboxID, err)
					}
				}
				if err := e.client.DeleteSnapshot(ctx, sn.SnapshotID); err != nil {
					errc <- fmt.Errorf("delete snapshot %s: %w", sn.SnapshotID, err)
				}
			}
		})
	}
	// Parents killed while they are being forked: the fork either made
	// its children (which work) or fails as not found / conflict.
	wg.Go(func() {
		for range rounds {
			p := newParent()
			forked := make(chan error, 1)
			go func() { forked <- forkAndRun(p, 3) }()
			time.Sleep(20 * time.Millisecond)
			if err := e.client.KillSandbox(ctx, p.SandboxID); err != nil && !hasStatus(err, http.StatusNotFound) {
				errc <- fmt.Errorf("kill parent %s mid-fork: %w", p.SandboxID, err)
			}
			if err := <-forked; err != nil && !hasStatus(err, http.StatusNotFound) && !hasStatus(err, http.StatusConflict) {
				errc <- fmt.Errorf("fork of a parent killed mid-fork: %w, want success, 404 or 409", err)
			}
		}
	})
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	for _, p := range parents {
		if err := e.client.KillSandbox(context.Background(), p.SandboxID); err != nil {
			t.Errorf("kill parent: %v", err)
		}
	}

	// Kills answer before their teardown ends: give the teardowns a moment.
	var left []string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if left = leaked(e, ids); len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		t.Errorf("of the %d sandboxes made, left on the host: %v", len(ids), left)
	}
}

// hasStatus says whether err is, or wraps, an API error with that status.
func hasStatus(err error, status int) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.Status == status
}

// warmContainers counts the server's warm containers (containers made
// ahead for restores, see internal/sandbox/warm.go): their directories
// carry a marker file. Each holds a network slot.
func (e *env) warmContainers() int {
	m, _ := filepath.Glob(filepath.Join(e.dataDir, "sandboxes", "*", "warm"))
	return len(m)
}

// pooledSandboxes counts the hot pool's sandboxes (HotPool per template:
// other tests' templates have theirs too), each holding a network slot.
func (e *env) pooledSandboxes() int {
	m, _ := filepath.Glob(filepath.Join(e.dataDir, "sandboxes", "*", "sandbox.json"))
	n := 0
	for _, p := range m {
		var sb struct {
			State string `json:"state"`
		}
		if b, err := os.ReadFile(p); err == nil && json.Unmarshal(b, &sb) == nil && sb.State == "pooled" {
			n++
		}
	}
	return n
}

package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/template"
)

// sparesManager is a manager with the fake runtime and a template store
// holding the template "img".
func sparesManager(t *testing.T) (*Manager, *template.Store) {
	t.Helper()
	dir := t.TempDir()
	envd := filepath.Join(dir, "envd")
	os.WriteFile(envd, []byte("envd"), 0o755)
	b, _ := json.Marshal(template.Template{Name: "img"})
	os.MkdirAll(filepath.Join(dir, "templates", "img"), 0o755)
	os.WriteFile(filepath.Join(dir, "templates", "img", "template.json"), b, 0o644)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	store, err := template.Open(filepath.Join(dir, "templates"), envd, log)
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Deps{Dir: filepath.Join(dir, "sandboxes"), Runtime: newFakeRuntime(), Templates: store, Limits: DefaultLimits(), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	m.reap.retryBase = time.Millisecond
	return m, store
}

// holding adds a sandbox of "img" in state st that holds the template.
func holding(t *testing.T, m *Manager, store *template.Store, st State) string {
	t.Helper()
	_, release, err := store.Acquire("img")
	if err != nil {
		t.Fatal(err)
	}
	id := newID()
	os.MkdirAll(m.rec.dir(id), 0o700)
	e := newEntry(Sandbox{ID: id, Template: "img", State: st, EndAt: time.Now().Add(time.Hour)}, release)
	m.reg.add(e)
	if st == StatePooled {
		m.hot.Add("img", id)
	}
	return id
}

// TestDeleteTemplateDropsSpares: pooled sandboxes (spares the user cannot
// see) neither block a template's delete nor count as its sandboxes; a
// sandbox of the user's does, until it is killed.
func TestDeleteTemplateDropsSpares(t *testing.T) {
	m, store := sparesManager(t)
	pooled := holding(t, m, store, StatePooled)
	user := holding(t, m, store, StateRunning)
	if got := m.Unlisted("img"); got != 1 {
		t.Errorf("got %d unlisted holders, want 1 (the pooled sandbox)", got)
	}
	err := m.DeleteTemplate("img")
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete while a sandbox runs: got %v, want a conflict", err)
	}
	if tpl, _ := store.Get("img"); tpl.InUse != 1 {
		t.Errorf("after the refused delete: in use by %d, want 1 (the user's sandbox; the spare is gone)", tpl.InUse)
	}
	if err := m.Kill(context.Background(), user); err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteTemplate("img"); err != nil {
		t.Fatalf("delete with no sandbox left: %v", err)
	}
	if _, err := m.Get(pooled); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("pooled sandbox after the delete: %v, want it gone", err)
	}
}

// TestDropSparesWaitsForOneBeingMade: a spare being made when a delete
// starts is listed (and dropped) before the delete goes on; none is made
// while the delete runs.
func TestDropSparesWaitsForOneBeingMade(t *testing.T) {
	m, _ := sparesManager(t)
	making, finish := make(chan struct{}), make(chan struct{})
	go m.warm.MakeOne("img", func() error {
		close(making)
		<-finish
		return nil
	})
	<-making
	if got := m.Unlisted("img"); got != 1 {
		t.Errorf("while a spare is being made: %d unlisted holders, want 1", got)
	}
	dropped := make(chan func(), 1)
	go func() { dropped <- m.dropSpares("img") }()
	select {
	case <-dropped:
		t.Fatal("dropSpares returned while a spare was being made")
	case <-time.After(50 * time.Millisecond):
	}
	close(finish)
	done := <-dropped
	if ran, _ := m.hot.MakeOne("img", func() error { return nil }); ran {
		t.Error("a spare was made while the template was being deleted")
	}
	done()
	if ran, _ := m.hot.MakeOne("img", func() error { return nil }); !ran {
		t.Error("no spare made after the delete ended")
	}
}

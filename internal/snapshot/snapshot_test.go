package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// checkpoint writes files into a new checkpoint directory of the store.
func checkpoint(t *testing.T, s *Store, files map[string]string) string {
	t.Helper()
	dir, err := s.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func chunkFiles(t *testing.T, s *Store) int {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(s.dir, "chunks"))
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

func TestContentAddressedAndRestorable(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Add(checkpoint(t, s, map[string]string{"checkpoint.img": "state-a", "pages.img": "same pages"}), Snapshot{Name: "a", Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Add(checkpoint(t, s, map[string]string{"checkpoint.img": "state-b", "pages.img": "same pages"}), Snapshot{Name: "b", Template: "busybox", Parent: a.ID})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := chunkFiles(t, s), 3; got != want {
		t.Errorf("chunks = %d, want %d (identical pages stored once)", got, want)
	}
	if a.Size != int64(len("state-a")+len("same pages")) {
		t.Errorf("size = %d", a.Size)
	}

	dir, done, release, err := s.Acquire(b.ID)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "checkpoint.img"))
	if err != nil || string(got) != "state-b" {
		t.Errorf("restore dir checkpoint.img = %q, %v", got, err)
	}
	done()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("restore dir still there after done: %v", err)
	}
	if err := s.Delete(b.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("delete while in use: %v, want conflict", err)
	}
	if err := s.Delete(a.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("delete a parent: %v, want conflict", err)
	}
	release()
	release() // idempotent

	// Survives a reopen.
	s2, err := Open(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Get(b.ID); err != nil {
		t.Fatalf("after reopen: %v", err)
	}
	if err := s2.Delete(b.ID); err != nil {
		t.Fatal(err)
	}
	if err := s2.Delete(a.ID); err != nil {
		t.Fatal(err)
	}
	if got := chunkFiles(t, s2); got != 0 {
		t.Errorf("chunks after deleting everything = %d, want 0", got)
	}
	if err := s2.Delete(a.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("delete twice: %v, want not found", err)
	}
}

func TestGC(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	add := func(name string, age time.Duration, internal bool) Snapshot {
		sn, err := s.Add(checkpoint(t, s, map[string]string{"checkpoint.img": name}), Snapshot{Name: name, Internal: internal, Kind: KindAuto, CreatedAt: time.Now().Add(-age)})
		if err != nil {
			t.Fatal(err)
		}
		return sn
	}
	old := add("old", 48*time.Hour, false)
	inUse := add("old-in-use", 48*time.Hour, false)
	fresh := add("fresh", time.Minute, false)
	leftover := add("fork-leftover", time.Minute, true)
	ready := add("ready:busybox", 48*time.Hour, true)
	// A non-internal snapshot with a reserved-looking name gets no exemption.
	fakeReady := add("ready:mine", 48*time.Hour, false)
	_, _, release, err := s.Acquire(inUse.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer release()

	deleted := s.GC(Policy{MaxAge: 24 * time.Hour})
	want := map[string]bool{old.ID: true, leftover.ID: true, fakeReady.ID: true}
	if len(deleted) != len(want) {
		t.Errorf("GC deleted %v, want %v", deleted, want)
	}
	for _, id := range deleted {
		if !want[id] {
			t.Errorf("GC deleted %s, which it must keep", id)
		}
	}
	for _, keep := range []Snapshot{inUse, fresh, ready} {
		if !s.Has(keep.ID) {
			t.Errorf("GC deleted %s (%s)", keep.ID, keep.Name)
		}
	}
	if got := s.GC(Policy{MaxCount: 1}); len(got) != 1 || got[0] != fresh.ID {
		t.Errorf("GC by count deleted %v, want only %s (the others are in use or ready)", got, fresh.ID)
	}
}

// userAndAuto fills a store with user snapshots (old ones) and agentenv's
// own, and returns them.
func userAndAuto(t *testing.T, s *Store, users, autos int) (user, auto []Snapshot) {
	t.Helper()
	for i := range users + autos {
		kind := KindUser
		if i >= users {
			kind = KindAuto
		}
		sn, err := s.Add(checkpoint(t, s, map[string]string{"checkpoint.img": fmt.Sprint("state ", i)}),
			Snapshot{Kind: kind, CreatedAt: time.Now().Add(-time.Duration(1000-i) * time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if kind == KindUser {
			user = append(user, sn)
		} else {
			auto = append(auto, sn)
		}
	}
	return user, auto
}

func TestUserSnapshotsOutliveTheCollector(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// The user's are the oldest, past the age limit, over the count and
	// the byte limits: the collector takes only agentenv's own.
	user, auto := userAndAuto(t, s, 3, 2)
	deleted := s.GC(Policy{MaxCount: 2, MaxAge: time.Hour, MaxBytes: 1})
	if got, want := len(deleted), len(auto); got != want {
		t.Errorf("GC deleted %d snapshots, want %d (agentenv's own)", got, want)
	}
	for _, sn := range user {
		if !s.Has(sn.ID) {
			t.Errorf("GC deleted the user's snapshot %s", sn.ID)
		}
	}
	for _, sn := range auto {
		if s.Has(sn.ID) {
			t.Errorf("GC kept agentenv's snapshot %s beyond the policy", sn.ID)
		}
	}
}

func TestAdmitRefusesWhenUsersFillTheStore(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s.SetPolicy(Policy{MaxCount: 3})
	user, auto := userAndAuto(t, s, 2, 2)
	// Room is made by collecting agentenv's own snapshots.
	release, err := s.Admit()
	if err != nil {
		t.Fatalf("admit with agentenv's snapshots to collect: %v", err)
	}
	for _, sn := range auto {
		if s.Has(sn.ID) {
			t.Errorf("admit kept agentenv's snapshot %s in a full store", sn.ID)
		}
	}
	// Two user snapshots and one admitted: the store is full.
	if _, err := s.Admit(); !errors.Is(err, errdefs.ErrInsufficientStorage) || !strings.Contains(err.Error(), "--snapshot-max-count") {
		t.Errorf("admit in a store full of user snapshots: %v, want insufficient storage naming --snapshot-max-count", err)
	}
	for _, sn := range user {
		if !s.Has(sn.ID) {
			t.Errorf("admit deleted the user's snapshot %s", sn.ID)
		}
	}
	release()
	release() // idempotent
	if r, err := s.Admit(); err != nil {
		t.Errorf("admit after the room was given back: %v", err)
	} else {
		r()
	}
	if err := s.Delete(user[0].ID); err != nil {
		t.Fatal(err)
	}
	s.SetPolicy(Policy{MaxBytes: 1})
	if _, err := s.Admit(); !errors.Is(err, errdefs.ErrInsufficientStorage) || !strings.Contains(err.Error(), "--snapshot-max-bytes") {
		t.Errorf("admit over the byte limit: %v, want insufficient storage naming --snapshot-max-bytes", err)
	}
}

func TestUnmarkedSnapshotsKind(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		sn   Snapshot
		want string
	}{
		{"made by the snapshot API", Snapshot{}, KindUser},
		{"a fork's checkpoint", Snapshot{Internal: true}, KindAuto},
		{"a ready template", Snapshot{Name: "ready:base", Internal: true}, KindAuto},
		{"a fleet fork's", Snapshot{Metadata: map[string]string{forkOfKey: "sbx"}}, KindAuto},
	}
	ids := make([]string, len(cases))
	for i, c := range cases {
		sn, err := s.Add(checkpoint(t, s, map[string]string{"checkpoint.img": c.name}), c.sn)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = sn.ID
		// As written before snapshots carried their kind.
		p := filepath.Join(dir, "meta", sn.ID+".json")
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		json.Unmarshal(b, &m)
		delete(m, "kind")
		b, _ = json.Marshal(m)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range cases {
		sn, err := s2.Get(ids[i])
		if err != nil {
			t.Fatal(err)
		}
		if sn.Kind != c.want {
			t.Errorf("%s, unmarked: kind %q, want %q", c.name, sn.Kind, c.want)
		}
	}
}

// Admissions racing for the last places of a full store: as many succeed
// as there are places, the others are refused.
func TestAdmitConcurrent(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s.SetPolicy(Policy{MaxCount: 5})
	userAndAuto(t, s, 2, 4) // 2 user snapshots kept, 4 of agentenv's to collect
	const racers = 16
	results := make(chan error, racers)
	var wg sync.WaitGroup
	for range racers {
		wg.Go(func() {
			_, err := s.Admit() // held until the test ends
			results <- err
		})
	}
	wg.Wait()
	close(results)
	admitted := 0
	for err := range results {
		switch {
		case err == nil:
			admitted++
		case !errors.Is(err, errdefs.ErrInsufficientStorage):
			t.Errorf("admit: %v, want nil or insufficient storage", err)
		}
	}
	if got, want := admitted, 3; got != want {
		t.Errorf("%d of %d racing admissions succeeded, want %d (5 places, 2 the user's)", got, racers, want)
	}
}

// TestAddHeldOutlivesTheCollector checks that a fork's checkpoint, which
// the collector takes whenever nothing holds it, is held from the moment
// it is stored: a collection (as a user snapshot's admission runs one)
// between its store and its children's restores leaves it, and it is
// collected once released.
func TestAddHeldOutlivesTheCollector(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sn, release, err := s.AddHeld(checkpoint(t, s, map[string]string{"checkpoint.img": "fork"}), Snapshot{Internal: true, Kind: KindAuto})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.GC(Policy{}); len(got) != 0 {
		t.Fatalf("GC of a held fork checkpoint deleted %v, want nothing", got)
	}
	if _, err := s.Admit(); err != nil {
		t.Fatal(err)
	}
	if !s.Has(sn.ID) {
		t.Fatal("a user snapshot's admission collected the held fork checkpoint")
	}
	release()
	if got := s.GC(Policy{}); len(got) != 1 || got[0] != sn.ID {
		t.Fatalf("GC after release deleted %v, want [%s]", got, sn.ID)
	}
}

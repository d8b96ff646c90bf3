package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/template"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

func TestCheckDisk(t *testing.T) {
	tests := []struct {
		name   string
		budget int64
		use    DiskUse
		need   int64
		ok     bool
	}{
		{"no budget", 0, DiskUse{Layers: 100 * gib}, 10 * gib, true},
		{"empty", 10 * gib, DiskUse{}, 10 * gib, true},
		{"fits exactly", 10 * gib, DiskUse{Layers: 5 * gib, Templates: 2 * gib, Snapshots: 2 * gib, Pending: gib - mib}, mib, true},
		{"one byte over", 10 * gib, DiskUse{Layers: 5 * gib, Templates: 2 * gib, Snapshots: 2 * gib, Pending: gib - mib}, mib + 1, false},
		{"layers alone", 10 * gib, DiskUse{Layers: 10 * gib}, 1, false},
		{"templates count", 10 * gib, DiskUse{Templates: 9 * gib}, 2 * gib, false},
		{"snapshots count", 10 * gib, DiskUse{Snapshots: 9 * gib}, 2 * gib, false},
		{"pending counts", 10 * gib, DiskUse{Pending: 9 * gib}, 2 * gib, false},
		{"nothing needed", 10 * gib, DiskUse{Layers: 20 * gib}, 0, true},
		{"a 1 TiB layer", 100 * gib, DiskUse{}, 1 << 40, false},
		{"over budget already", 10 * gib, DiskUse{Layers: 11 * gib}, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkDisk(tt.budget, tt.use, tt.need, "a sandbox")
			if (err == nil) != tt.ok {
				t.Fatalf("checkDisk(%d, %+v, %d) = %v, want ok=%v", tt.budget, tt.use, tt.need, err, tt.ok)
			}
			if err == nil {
				return
			}
			if !errors.Is(err, errdefs.ErrInsufficientStorage) {
				t.Errorf("got %v, want insufficient storage (507)", err)
			}
			// The message says what is used, the budget and what to do.
			for _, want := range []string{FormatBytes(tt.use.Total()), FormatBytes(tt.budget), "kill sandboxes", "delete snapshots or templates", "--disk-budget"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("message %q lacks %q", err, want)
				}
			}
		})
	}
}

func TestParseDiskBudget(t *testing.T) {
	tests := []struct {
		in   string
		want DiskBudget
		ok   bool
	}{
		{"90%", DiskBudget{Percent: 90}, true},
		{"12.5%", DiskBudget{Percent: 12.5}, true},
		{"100%", DiskBudget{Percent: 100}, true},
		{"0", DiskBudget{}, true},
		{"500G", DiskBudget{Bytes: 500 * gib}, true},
		{"500GiB", DiskBudget{Bytes: 500 * gib}, true},
		{"80000M", DiskBudget{Bytes: 80000 * mib}, true},
		{"2T", DiskBudget{Bytes: 2 << 40}, true},
		{"4096", DiskBudget{Bytes: 4096}, true},
		{"0%", DiskBudget{}, false},
		{"101%", DiskBudget{}, false},
		{"-1G", DiskBudget{}, false},
		{"lots", DiskBudget{}, false},
		{"9999999999T", DiskBudget{}, false},
		{"", DiskBudget{}, false},
	}
	for _, tt := range tests {
		got, err := ParseDiskBudget(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseDiskBudget(%q) = %+v, %v; want %+v, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ParseDiskBudget(%q): %v, want an invalid argument", tt.in, err)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 64 * mib: "64.0 MiB", 10 * gib: "10.0 GiB", 3 << 40: "3.0 TiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestDiskLedger: a layer counts from its claim, as its sandbox's once
// bound, while the sandbox is live or being torn down, and not after; a
// claim never bound gives its bytes back.
func TestDiskLedger(t *testing.T) {
	m := &Manager{registry: registry{boxes: map[string]*entry{}}, dying: map[string]*teardown{}}
	var templates, snapshots atomic.Int64
	d := NewDisk(10*gib, templates.Load, snapshots.Load)
	d.Attach(m)
	templates.Store(gib)
	snapshots.Store(gib)

	a, err := d.claimLayer(4<<10, "a")
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Use(); got.Pending != 4*gib || got.Total() != 6*gib {
		t.Fatalf("after a claim: %+v, want 4 GiB pending, 6 GiB in all", got)
	}
	m.boxes["a"] = &entry{}
	a.bind("a")
	a.release() // no-op once bound
	if got := d.Use(); got.Layers != 4*gib || got.Pending != 0 {
		t.Fatalf("after bind: %+v, want 4 GiB of layers, none pending", got)
	}
	if _, err := d.claimLayer(5<<10, "b"); !errors.Is(err, errdefs.ErrInsufficientStorage) {
		t.Fatalf("claim of 5 GiB with 4 GiB left: %v, want insufficient storage", err)
	}
	b, err := d.claimLayer(4<<10, "b")
	if err != nil {
		t.Fatal(err)
	}
	b.release() // the create failed
	if got := d.Use(); got.Total() != 6*gib {
		t.Fatalf("after a failed create: %+v, want 6 GiB in all", got)
	}
	// Killed: counted while torn down, then gone.
	delete(m.boxes, "a")
	m.dying["a"] = &teardown{}
	if got := d.Use(); got.Layers != 4*gib {
		t.Fatalf("while torn down: %+v, want the layer counted", got)
	}
	delete(m.dying, "a")
	if got := d.Use(); got.Layers != 0 {
		t.Fatalf("after teardown: %+v, want no layers", got)
	}
	// A memory layer (diskMB 0) needs no room.
	if _, err := d.claimLayer(0, "memory"); err != nil {
		t.Fatal(err)
	}
	release, err := d.Reserve("a build", 8*gib)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Reserve("another build", 1); !errors.Is(err, errdefs.ErrInsufficientStorage) {
		t.Errorf("reserve past the budget: %v, want insufficient storage", err)
	}
	release()
	release()
	if got := d.Use(); got.Pending != 0 {
		t.Errorf("after release: %+v, want none pending", got)
	}
	var nilDisk *Disk
	if _, err := nilDisk.claimLayer(1<<20, "x"); err != nil {
		t.Errorf("a nil Disk refused: %v", err)
	}
}

// TestDiskLedgerConcurrent: claims at once never admit more than the
// budget (run with -race).
func TestDiskLedgerConcurrent(t *testing.T) {
	m := &Manager{registry: registry{boxes: map[string]*entry{}}, dying: map[string]*teardown{}}
	d := NewDisk(10*gib, nil, nil)
	d.Attach(m)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			c, err := d.claimLayer(1<<10, fmt.Sprint(i))
			if err != nil {
				return
			}
			admitted.Add(1)
			if i%2 == 0 {
				id := fmt.Sprint("sb", i)
				m.mu.Lock()
				m.boxes[id] = &entry{}
				m.mu.Unlock()
				c.bind(id)
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != 10 {
		t.Errorf("admitted %d layers of 1 GiB in a 10 GiB budget, want 10", got)
	}
	if got := d.Use(); got.Total() != 10*gib {
		t.Errorf("use %+v, want 10 GiB", got)
	}
}

// TestResolveDiskBudget: a size is taken as it is; a share is of the free
// space plus what the data directory holds already.
func TestResolveDiskBudget(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "held"), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, _, err := (DiskBudget{Bytes: 5 * gib}).Resolve(dir); err != nil || got != 5*gib {
		t.Errorf("Resolve of 5 GiB = %d, %v", got, err)
	}
	if got, _, err := (DiskBudget{}).Resolve(dir); err != nil || got != 0 {
		t.Errorf("Resolve of no budget = %d, %v; want 0", got, err)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * st.Bsize
	got, how, err := (DiskBudget{Percent: 50}).Resolve(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Other writers on the host change the free space meanwhile: 1 %.
	want := (free + template.DiskUsage(dir)) / 2
	if diff := got - want; diff > want/100 || diff < -want/100 {
		t.Errorf("Resolve of 50%% = %d, want about %d (%s)", got, want, how)
	}
	if !strings.Contains(how, "50%") || !strings.Contains(how, dir) {
		t.Errorf("Resolve says %q, want the share and the directory", how)
	}
}

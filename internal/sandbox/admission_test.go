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
	"github.com/agentenv/agentenv/internal/runtime/ocispec"
	"github.com/agentenv/agentenv/internal/template"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

func TestCheckDisk(t *testing.T) {
	unmeasured := func(u DiskUse) DiskUse { u.Free = -1; return u }
	tests := []struct {
		name   string
		limits diskLimits
		use    DiskUse
		need   int64
		ok     bool
		words  []string
	}{
		{"no limits", diskLimits{}, unmeasured(DiskUse{Layers: 100 * gib}), 10 * gib, true, nil},
		{"budget: empty", diskLimits{budget: 10 * gib}, unmeasured(DiskUse{}), 10 * gib, true, nil},
		{"budget: fits exactly", diskLimits{budget: 10 * gib}, unmeasured(DiskUse{Layers: 5 * gib, Templates: 2 * gib, Snapshots: 2 * gib, Pending: gib - mib}), mib, true, nil},
		{"budget: one byte over", diskLimits{budget: 10 * gib}, unmeasured(DiskUse{Layers: 5 * gib, Templates: 2 * gib, Snapshots: 2 * gib, Pending: gib - mib}), mib + 1, false, []string{"--disk-budget", "10.0 GiB"}},
		{"budget: streams count", diskLimits{budget: 10 * gib}, unmeasured(DiskUse{Writing: 9 * gib}), 2 * gib, false, []string{"--disk-budget"}},
		{"budget: sources count", diskLimits{budget: 10 * gib}, unmeasured(DiskUse{Other: []NamedBytes{{"build cache", 9 * gib}}}), 2 * gib, false, []string{"build cache 9.0 GiB"}},
		{"budget: nothing needed", diskLimits{budget: 10 * gib}, unmeasured(DiskUse{Layers: 20 * gib}), 0, true, nil},
		{"reserve: room", diskLimits{reserve: 2 * gib}, DiskUse{Free: 10 * gib}, 8 * gib, true, nil},
		{"reserve: one byte into it", diskLimits{reserve: 2 * gib}, DiskUse{Free: 10 * gib}, 8*gib + 1, false, []string{"--disk-reserve", "8.0 GiB free for new work", "2.0 GiB kept free"}},
		{"reserve: reservations count", diskLimits{reserve: 2 * gib}, DiskUse{Free: 10 * gib, Pending: 7 * gib}, 2 * gib, false, []string{"--disk-reserve"}},
		{"reserve: streams are in the free space already", diskLimits{reserve: 2 * gib}, DiskUse{Free: 10 * gib, Writing: 7 * gib}, 2 * gib, true, nil},
		// A sandbox being torn down gives back its layer from its kill on.
		{"reserve: layers being freed count as free", diskLimits{reserve: 2 * gib}, DiskUse{Free: 2 * gib, Freeing: 3 * gib}, 2 * gib, true, nil},
		// Thin: 1,000 idle sandboxes of a 2 GiB layer each hold what they use.
		{"thin layers", diskLimits{reserve: 2 * gib}, DiskUse{Free: 10 * gib, Layers: 1000 * mib, Sandboxes: 1000}, 64 * 8 * mib, true, nil},
		{"full already", diskLimits{reserve: 2 * gib}, DiskUse{Free: gib}, 1, false, []string{"0 B free for new work"}},
		{"both: the budget refuses", diskLimits{budget: 5 * gib, reserve: 2 * gib}, DiskUse{Free: 100 * gib, Layers: 5 * gib}, 1, false, []string{"--disk-budget"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkDisk(tt.limits, tt.use, tt.need, "a sandbox")
			if (err == nil) != tt.ok {
				t.Fatalf("checkDisk(%+v, %+v, %d) = %v, want ok=%v", tt.limits, tt.use, tt.need, err, tt.ok)
			}
			if err == nil {
				return
			}
			if !errors.Is(err, errdefs.ErrInsufficientStorage) {
				t.Errorf("got %v, want insufficient storage (507)", err)
			}
			// The message says what is used, the limit and what to do.
			for _, want := range append([]string{"a sandbox", FormatBytes(tt.use.Total()), "kill sandboxes", "delete snapshots, templates or volumes"}, tt.words...) {
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
		{"none", DiskBudget{}, true},
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

// fakeFS is a data filesystem whose free space a test sets.
type fakeFS struct{ free atomic.Int64 }

func (f *fakeFS) statfs(string) (int64, error) { return f.free.Load(), nil }

// ledgerManager is a manager with no sandboxes whose layers are files a
// test writes (LayerBytes measures them as it does the real ones).
func ledgerManager(t *testing.T) *Manager {
	return &Manager{d: Deps{Dir: t.TempDir()}}
}

// writeLayer gives sandbox id of m a write layer holding n bytes.
func writeLayer(t *testing.T, m *Manager, id string, n int64) {
	t.Helper()
	p := ocispec.FilestorePath(m.rec.dir(id), id)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, make([]byte, n), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestDiskLedger: a layer counts what it holds (thin), while its sandbox
// is live; from its kill on it counts as being freed; reservations hold
// free space, streams' charges hold budget only; meters refuse at the
// first chunk past the reserve and give back all on close.
func TestDiskLedger(t *testing.T) {
	m := ledgerManager(t)
	fsys := &fakeFS{}
	fsys.free.Store(10 * gib)
	var templates, snapshots atomic.Int64
	d := NewDisk(DiskConfig{Reserve: 2 * gib, Dir: "/data", Templates: templates.Load, Snapshots: snapshots.Load})
	d.statfs = fsys.statfs
	d.Attach(m)
	templates.Store(gib)
	snapshots.Store(gib)

	// A live sandbox's layer counts what it holds, not its size.
	m.reg.add(&entry{sb: Sandbox{ID: "a"}})
	writeLayer(t, m, "a", 3*mib)
	if got := d.Use(); got.Layers < 3*mib || got.Layers > 4*mib || got.Sandboxes != 1 {
		t.Fatalf("one sandbox holding 3 MiB: %+v, want its layer at about 3 MiB", got)
	}
	// Reservations hold free space until released.
	release, err := d.Reserve("a checkpoint", 7*gib)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Reserve("another", 2*gib); !errors.Is(err, errdefs.ErrInsufficientStorage) {
		t.Fatalf("reserve past the reserve: %v, want insufficient storage", err)
	}
	release()
	release()
	if got := d.Use(); got.Pending != 0 {
		t.Fatalf("after release: %+v, want none pending", got)
	}
	// Killed: its layer is being freed, so a create near the edge fits.
	fsys.free.Store(2*gib + mib)
	if err := d.fits(layerStartBytes, "a create"); !errors.Is(err, errdefs.ErrInsufficientStorage) {
		t.Fatalf("create with 1 MiB above the reserve: %v, want insufficient storage", err)
	}
	writeLayer(t, m, "a", 64*mib)
	m.reg.end(&teardown{sb: Sandbox{ID: "a"}}, endNote{})
	if err := d.fits(layerStartBytes, "a create"); err != nil {
		t.Fatalf("create after a kill that frees 64 MiB: %v", err)
	}
	if got := d.Use(); got.Layers != 0 || got.Freeing < 64*mib {
		t.Fatalf("while torn down: %+v, want no layers held and 64 MiB being freed", got)
	}
	m.reg.tornDown("a")

	// A meter charges chunk by chunk and refuses at the reserve.
	fsys.free.Store(2*gib + 10*mib)
	mt := d.Meter("an upload")
	var wrote int64
	for ; wrote < gib; wrote += mib {
		if err := mt.Charge(mib); err != nil {
			if !errors.Is(err, errdefs.ErrInsufficientStorage) || !strings.Contains(err.Error(), "an upload") {
				t.Fatalf("meter refusal: %v, want insufficient storage for an upload", err)
			}
			break
		}
		fsys.free.Add(-mib) // what it wrote shows as used
	}
	if wrote > 10*mib || wrote < 4*mib {
		t.Errorf("meter admitted %d MiB with 10 MiB above the reserve, want between 4 and 10", wrote>>20)
	}
	if err := mt.Charge(1); err == nil {
		t.Errorf("a refused meter admitted more")
	}
	mt.Close()
	mt.Close()
	if got := d.Use(); got.Writing != 0 {
		t.Errorf("after a meter closed: %+v, want nothing being written", got)
	}

	// A budget counts what agentenv holds: sources, template builds'
	// charges, a stream's chunk in flight.
	fsys.free.Store(100 * gib)
	b := NewDisk(DiskConfig{Budget: 4 * gib, Reserve: 2 * gib, Dir: "/data", Templates: templates.Load, Snapshots: snapshots.Load})
	b.statfs = fsys.statfs
	b.Attach(m)
	b.AddSource(DiskSource{Name: "build cache", Bytes: func() int64 { return gib }})
	tb, err := b.Charge("a template build", gib-meterChunk)
	if err != nil {
		t.Fatalf("charge within the budget: %v", err)
	}
	bm := b.Meter("a build")
	if err := bm.Charge(1); err != nil {
		t.Fatalf("meter within the budget: %v", err)
	}
	if _, err := b.Reserve("a create", 1); !errors.Is(err, errdefs.ErrInsufficientStorage) || !strings.Contains(err.Error(), "build cache 1.0 GiB") {
		t.Fatalf("reserve past the budget: %v, want insufficient storage naming the build cache", err)
	}
	bm.Close()
	tb()
	if _, err := b.Reserve("a create", gib); err != nil {
		t.Fatalf("reserve after the build's charges were given back: %v", err)
	}
	var nilDisk *Disk
	if _, err := nilDisk.Reserve("x", gib); err != nil {
		t.Errorf("a nil Disk refused: %v", err)
	}
	if err := nilDisk.Meter("x").Charge(gib); err != nil {
		t.Errorf("a nil Disk's meter refused: %v", err)
	}
}

// TestDiskLedgerConcurrent: reservations and meters at once never admit
// more than the free space above the reserve (run with -race).
func TestDiskLedgerConcurrent(t *testing.T) {
	m := ledgerManager(t)
	fsys := &fakeFS{}
	fsys.free.Store(12 * gib)
	d := NewDisk(DiskConfig{Reserve: 2 * gib, Dir: "/data"})
	d.statfs = fsys.statfs
	d.Attach(m)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			if i%2 == 0 {
				if _, err := d.Reserve(fmt.Sprint(i), gib); err == nil {
					admitted.Add(1)
				}
				return
			}
			// A chunk is held until the stream asks for the next.
			if err := d.Meter(fmt.Sprint(i)).Charge(gib); err == nil {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != 10 {
		t.Errorf("admitted %d GiB with 10 GiB above the reserve, want 10", got)
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

package sandbox

import (
	"fmt"
	"strings"
	"sync"
	"syscall"

	"github.com/agentenv/agentenv/internal/diskmeter"
	"github.com/agentenv/agentenv/internal/errdefs"
)

// Disk admission: thin provisioning with a reserve. What agentenv keeps
// in its data directory counts as what it uses, not as what it might use:
//
//   - a sandbox's write layer counts its allocated blocks (LayerBytes): a
//     sparse file that gives its sandbox ENOSPC at its own size; the layer
//     of a sandbox being torn down counts as freed from its kill on;
//   - templates, snapshots, the build cache, uploaded build files and
//     volumes count what they take (sources);
//   - work about to write holds a reservation (a create's first layer
//     blocks, a checkpoint); a stream being written charges a meter chunk
//     by chunk (uploads, unpacking, build steps, volume writes), each
//     chunk reserved until the next, by when the filesystem and the
//     source that measures where it went count it; a template build
//     charges what it wrote until its template counts (Charge).
//
// New work is admitted while the data filesystem keeps its reserve free
// (statfs, less the reservations, plus the layers being freed), and while
// what agentenv holds stays within the operator's byte budget, if any.
// Refusals are errdefs.ErrInsufficientStorage (HTTP 507), saying what is
// used, the limit, and what frees room. A meter's refusal stops its stream
// at that chunk; its writer removes what it wrote.

// DiskConfig configures a Disk.
type DiskConfig struct {
	// Budget caps what agentenv holds, in bytes (0: no cap).
	Budget int64
	// Reserve is the free space kept on Dir's filesystem (0: none).
	Reserve int64
	// Dir is on the data filesystem, whose free space is measured; ""
	// measures none (then only Budget applies).
	Dir string
	// Templates and Snapshots report the bytes of their stores.
	Templates, Snapshots func() int64
}

// DiskSource is one more thing agentenv holds on the data filesystem.
type DiskSource struct {
	Name  string
	Bytes func() int64
}

// DiskUse is what the data directory holds or has promised, in bytes.
type DiskUse struct {
	// Layers: the allocated blocks of the live sandboxes' write layers.
	Layers    int64
	Sandboxes int
	// Templates: the template directories (root tree and image).
	Templates int64
	// Snapshots: the snapshot store's chunks.
	Snapshots int64
	// Other: the sources beside those (build cache, uploads, volumes).
	Other []NamedBytes
	// Pending: reservations of work about to write (creates, checkpoints).
	Pending int64
	// Writing: what template builds in progress have written (Charge).
	Writing int64
	// Free is what ordinary writers may still write on the filesystem
	// (-1: not measured); Freeing, the layers of sandboxes being torn
	// down, about to be freed.
	Free, Freeing int64
}

// NamedBytes is a source's bytes.
type NamedBytes struct {
	Name  string
	Bytes int64
}

// Total is all agentenv holds or has promised.
func (u DiskUse) Total() int64 {
	n := u.Layers + u.Templates + u.Snapshots + u.Pending + u.Writing
	for _, o := range u.Other {
		n += o.Bytes
	}
	return n
}

// Avail is the free space new work may count on: what is free, and will
// be once the torn-down layers are gone, less what is promised.
func (u DiskUse) Avail() int64 { return u.Free + u.Freeing - u.Pending }

// diskLimits are what admission holds use to.
type diskLimits struct {
	budget, reserve int64
}

// checkDisk admits need bytes for what beside u: the filesystem keeps
// reserve free (when Free is measured) and u stays within budget (0: no
// budget). The refusal says what is used, the limit, and what frees room.
func checkDisk(l diskLimits, u DiskUse, need int64, what string) error {
	if need <= 0 {
		return nil
	}
	held := fmt.Sprintf("agentenv holds %s: sandbox write layers %s (%d sandboxes, as used), templates %s, snapshots %s",
		FormatBytes(u.Total()), FormatBytes(u.Layers), u.Sandboxes, FormatBytes(u.Templates), FormatBytes(u.Snapshots))
	for _, o := range u.Other {
		held += fmt.Sprintf(", %s %s", o.Name, FormatBytes(o.Bytes))
	}
	held += fmt.Sprintf(", in progress %s", FormatBytes(u.Pending+u.Writing))
	if u.Free >= 0 && u.Avail()-need < l.reserve {
		return errdefs.InsufficientStorage("no room on the host disk for %s: it needs %s, and the data filesystem has %s free for new work beside the %s kept free (--disk-reserve); %s: "+
			"kill sandboxes, delete snapshots, templates or volumes, free space on the host, or ask the operator to lower --disk-reserve",
			what, FormatBytes(need), FormatBytes(max(u.Avail()-l.reserve, 0)), FormatBytes(l.reserve), held)
	}
	if l.budget > 0 && u.Total()+need > l.budget {
		return errdefs.InsufficientStorage("no room in agentenv's disk budget for %s: it needs %s more beyond the %s budget (--disk-budget); %s: "+
			"kill sandboxes, delete snapshots, templates or volumes, or ask the operator to raise --disk-budget",
			what, FormatBytes(u.Total()+need-l.budget), FormatBytes(l.budget), held)
	}
	return nil
}

// Disk is the disk admission of one host. A nil *Disk admits everything.
type Disk struct {
	cfg DiskConfig
	// statfs measures the free space of a directory (a field for tests).
	statfs func(dir string) (int64, error)

	// mu is taken before the manager's mu (live reads it), never after.
	mu      sync.Mutex
	m       *Manager
	sources []DiskSource
	pending int64
	writing int64
}

// NewDisk returns the admission of cfg.
func NewDisk(cfg DiskConfig) *Disk {
	return &Disk{cfg: cfg, statfs: statfsFree}
}

func statfsFree(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// Attach connects the manager whose sandboxes hold write layers. Call it
// before creates.
func (d *Disk) Attach(m *Manager) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.m = m
}

// AddSource counts what src reports as held.
func (d *Disk) AddSource(src DiskSource) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sources = append(d.sources, src)
}

// Budget is the budget in bytes (0: none).
func (d *Disk) Budget() int64 {
	if d == nil {
		return 0
	}
	return d.cfg.Budget
}

// ReserveBytes is the free space kept, in bytes.
func (d *Disk) ReserveBytes() int64 {
	if d == nil {
		return 0
	}
	return d.cfg.Reserve
}

// Use returns what agentenv holds and the filesystem's free space now.
func (d *Disk) Use() DiskUse {
	if d == nil {
		return DiskUse{Free: -1}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.useLocked(true)
}

// useLocked measures the free space, the layers being freed and the
// reservations; with held also what agentenv holds (a stat per live
// sandbox and every source: only when a budget is set or for a refusal's
// words). Callers hold d.mu.
func (d *Disk) useLocked(held bool) DiskUse {
	u := DiskUse{Pending: d.pending, Writing: d.writing, Free: -1}
	if d.cfg.Dir != "" {
		if free, err := d.statfs(d.cfg.Dir); err == nil {
			u.Free = free
		}
	}
	if d.m != nil {
		live, dying := d.m.reg.ids(held)
		for _, id := range dying {
			u.Freeing += d.m.LayerBytes(id)
		}
		for _, id := range live {
			u.Layers += d.m.LayerBytes(id)
		}
		u.Sandboxes = len(live)
	}
	if !held {
		return u
	}
	if d.cfg.Templates != nil {
		u.Templates = d.cfg.Templates()
	}
	if d.cfg.Snapshots != nil {
		u.Snapshots = d.cfg.Snapshots()
	}
	for _, s := range d.sources {
		u.Other = append(u.Other, NamedBytes{s.Name, s.Bytes()})
	}
	return u
}

// checkLocked admits need bytes for what now. Callers hold d.mu.
func (d *Disk) checkLocked(need int64, what string) error {
	if need <= 0 || d.cfg.Budget <= 0 && d.cfg.Dir == "" {
		return nil
	}
	l := diskLimits{budget: d.cfg.Budget, reserve: d.cfg.Reserve}
	if err := checkDisk(l, d.useLocked(d.cfg.Budget > 0), need, what); err == nil {
		return nil
	}
	// Refused: measure all of it, for the words and to be sure.
	return checkDisk(l, d.useLocked(true), need, what)
}

// Reserve admits bytes for work about to write them (a checkpoint, a
// create's first layer blocks) and holds them until release (safe to call
// more than once), by when what the work wrote counts on its own.
func (d *Disk) Reserve(what string, bytes int64) (release func(), err error) {
	if d == nil {
		return func() {}, nil
	}
	return d.hold(&d.pending, what, bytes)
}

// Charge admits bytes a stream is writing now (a template build's files):
// held against the budget until release, but not as a reservation, since
// the filesystem's free space shows them once written.
func (d *Disk) Charge(what string, bytes int64) (release func(), err error) {
	if d == nil {
		return func() {}, nil
	}
	return d.hold(&d.writing, what, bytes)
}

// hold admits bytes for what and adds them to the counter (guarded by
// d.mu) until the returned release, which is safe to call more than once.
func (d *Disk) hold(counter *int64, what string, bytes int64) (release func(), err error) {
	if bytes <= 0 {
		return func() {}, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.checkLocked(bytes, what); err != nil {
		return nil, err
	}
	*counter += bytes
	var once sync.Once
	return func() {
		once.Do(func() {
			d.mu.Lock()
			*counter -= bytes
			d.mu.Unlock()
		})
	}, nil
}

// fits says whether bytes more fit now, reserving nothing.
func (d *Disk) fits(bytes int64, what string) error {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.checkLocked(bytes, what)
}

// meterChunk is how much a meter admits at a time: each admission measures
// the filesystem (and with a budget, what agentenv holds), so not one per
// write; a stream overshoots its refusal by less than this.
const meterChunk = 4 << 20

// Meter starts a meter for a stream that writes to the data filesystem,
// into a directory a source measures (or the templates' store).
func (d *Disk) Meter(what string) diskmeter.Meter {
	if d == nil {
		return diskmeter.Open(nil).Start(what)
	}
	return &meter{d: d, what: what}
}

// Opener is Meter as a diskmeter.Open (nil for a nil Disk).
func (d *Disk) Opener() diskmeter.Open {
	if d == nil {
		return nil
	}
	return d.Meter
}

type meter struct {
	d    *Disk
	what string

	mu      sync.Mutex
	used    int64 // charged by the stream
	granted int64 // admitted in all
	// out is the last chunk admitted, held as a reservation (in
	// d.pending) until the stream asks for more, by when it is written:
	// then the filesystem's free space and the source that measures where
	// it went count it. So streams at once never share one stretch of
	// free space, and nothing is counted twice.
	out     int64
	refused error
}

func (m *meter) Charge(n int64) error {
	if n <= 0 {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.refused != nil {
		return m.refused
	}
	m.used += n
	if m.used <= m.granted {
		return nil
	}
	grant := max(m.used-m.granted, meterChunk)
	d := m.d
	d.mu.Lock()
	d.pending -= m.out // written by now
	m.out = 0
	err := d.checkLocked(grant, fmt.Sprintf("%s (%s written so far)", m.what, FormatBytes(m.used-n)))
	if err == nil {
		d.pending += grant
		m.out = grant
	}
	d.mu.Unlock()
	if err != nil {
		m.refused = err
		return err
	}
	m.granted += grant
	return nil
}

func (m *meter) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.d.mu.Lock()
	m.d.pending -= m.out
	m.d.mu.Unlock()
	m.granted, m.used, m.out = 0, 0, 0
	if m.refused == nil {
		m.refused = errdefs.Invalid("%s: the meter was closed", m.what)
	}
}

// layerStartBytes is what a new sandbox's write layer is reserved while
// the sandbox is created: the blocks a boot or restore writes into it
// (an idle busybox sandbox takes well under a MiB; a restore rewrites
// what its snapshot's layer held, added by the caller). From then on the
// layer counts as used.
const layerStartBytes = 8 << 20

// describeUse is u on one line, for the log.
func describeUse(u DiskUse) string {
	var b strings.Builder
	fmt.Fprintf(&b, "held %s (layers %s, templates %s, snapshots %s", FormatBytes(u.Total()), FormatBytes(u.Layers), FormatBytes(u.Templates), FormatBytes(u.Snapshots))
	for _, o := range u.Other {
		fmt.Fprintf(&b, ", %s %s", o.Name, FormatBytes(o.Bytes))
	}
	fmt.Fprintf(&b, "), free %s", FormatBytes(u.Free))
	return b.String()
}

// DescribeUse is what Use returns, on one line for the log.
func (d *Disk) DescribeUse() string { return describeUse(d.Use()) }

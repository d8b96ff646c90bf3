package sandbox

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/template"
)

// Disk admission (issue 16, finding 5). What agentenv keeps in its data
// directory stays within a budget, so that one sandbox, build or snapshot
// cannot fill the host's disk under the others:
//
//   - every sandbox's write layer counts at its full size from admission to
//     teardown: the layer is a sparse file that its sandbox can grow to that
//     size at any time, and nothing would stop it on a full host disk;
//   - templates count their directories' bytes, snapshots the store's;
//   - work in progress (a build's files, a checkpoint) holds a reservation.
//
// Admission refuses with errdefs.ErrInsufficientStorage (HTTP 507), saying
// what is used, the budget, and what frees room.

// DiskBudget is the operator's --disk-budget as given: a size, or a share
// of the data directory's filesystem. The zero value means no budget.
type DiskBudget struct {
	Bytes   int64
	Percent float64
}

// DefaultDiskBudget is the CLI's default: 90 % of what agentenv can have on
// its filesystem (see DiskBudget.Resolve). The 10 % left is room for what
// the budget does not count: logs, runsc state, sandbox records, other
// programs' growth, and the file system's own metadata.
const DefaultDiskBudget = "90%"

// ParseDiskBudget reads a --disk-budget: "N%" (of the data filesystem), a
// size in bytes with an optional binary suffix (K, M, G, T: "500G"), or 0
// for no budget.
func ParseDiskBudget(s string) (DiskBudget, error) {
	s = strings.TrimSpace(s)
	bad := errdefs.Invalid("--disk-budget %q: give a share of the data filesystem (90%%), a size (500G, 80000M), or 0 for no budget", s)
	if p, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || f <= 0 || f > 100 || math.IsNaN(f) {
			return DiskBudget{}, bad
		}
		return DiskBudget{Percent: f}, nil
	}
	n, err := ParseSize(s)
	if err != nil {
		return DiskBudget{}, bad
	}
	return DiskBudget{Bytes: n}, nil
}

// ParseSize reads a size in bytes with an optional binary suffix: K, M, G,
// T (with or without "i"/"iB"/"B").
func ParseSize(s string) (int64, error) {
	s = strings.ToUpper(strings.TrimSpace(s))
	s = strings.TrimSuffix(strings.TrimSuffix(s, "B"), "I")
	shift := 0
	if s != "" {
		switch s[len(s)-1] {
		case 'K':
			shift = 10
		case 'M':
			shift = 20
		case 'G':
			shift = 30
		case 'T':
			shift = 40
		}
		if shift > 0 {
			s = s[:len(s)-1]
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("size %q: give a whole number of bytes, K, M, G or T", s)
	}
	return n << shift, nil
}

func (b DiskBudget) String() string {
	switch {
	case b.Percent > 0:
		return strconv.FormatFloat(b.Percent, 'f', -1, 64) + "%"
	case b.Bytes > 0:
		return FormatBytes(b.Bytes)
	}
	return "none"
}

// Resolve turns the budget into bytes for the data directory dir. A share
// is of what agentenv can have on that filesystem: the space free for
// ordinary writers (reserved blocks are left to the system) plus what dir
// holds already; so files of other programs are not agentenv's to use.
// It also says how it got there, for the log. 0: no budget.
func (b DiskBudget) Resolve(dir string) (int64, string, error) {
	if b.Percent <= 0 {
		return b.Bytes, "--disk-budget " + b.String(), nil
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, "", fmt.Errorf("disk budget: %w", err)
	}
	free := int64(st.Bavail) * st.Bsize
	own := template.DiskUsage(dir)
	n := int64(b.Percent / 100 * float64(free+own))
	how := fmt.Sprintf("%s of the %s agentenv can have on its filesystem (%s free, %s in %s already)",
		b, FormatBytes(free+own), FormatBytes(free), FormatBytes(own), dir)
	return max(n, 1), how, nil
}

// DiskUse is what the data directory holds or has promised, in bytes.
type DiskUse struct {
	// Layers: the sandboxes' write layers at their full size.
	Layers int64
	// Templates: the template directories (root tree and image).
	Templates int64
	// Snapshots: the snapshot store's chunks.
	Snapshots int64
	// Pending: reservations of work in progress (creates not yet counted
	// in Layers, builds, checkpoints).
	Pending int64
}

// Total is all of it.
func (u DiskUse) Total() int64 { return u.Layers + u.Templates + u.Snapshots + u.Pending }

// checkDisk admits need bytes for what when they fit in budget beside u
// (budget 0: no budget). The refusal says what is used, the budget, and
// what frees room.
func checkDisk(budget int64, u DiskUse, need int64, what string) error {
	if budget <= 0 || need <= 0 || u.Total() <= budget-need {
		return nil
	}
	return errdefs.InsufficientStorage("no room on the host disk for %s: it needs %s more, and agentenv uses %s of its %s disk budget "+
		"(sandbox write layers at full size %s, templates %s, snapshots %s, in progress %s): "+
		"kill sandboxes, delete snapshots or templates, or ask the operator to raise --disk-budget",
		what, FormatBytes(need), FormatBytes(u.Total()), FormatBytes(budget),
		FormatBytes(u.Layers), FormatBytes(u.Templates), FormatBytes(u.Snapshots), FormatBytes(u.Pending))
}

// FormatBytes writes n in binary units: "512 B", "64.0 MiB", "10.0 GiB".
func FormatBytes(n int64) string {
	const unit = 1 << 10
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}

// Disk is the disk admission of one host: a budget, what counts against
// it, and the reservations in force. A nil *Disk admits everything.
type Disk struct {
	budget    int64
	templates func() int64
	snapshots func() int64

	// mu is taken before the manager's mu (live reads it), never after.
	mu      sync.Mutex
	m       *Manager
	pending int64
	// layers is the write-layer size of each sandbox admitted (or adopted);
	// an ID no longer live is dropped at the next admission.
	layers map[string]int64
}

// NewDisk returns the admission for budget bytes (0: no budget), counting
// the bytes templates and snapshots report.
func NewDisk(budget int64, templates, snapshots func() int64) *Disk {
	return &Disk{budget: budget, templates: templates, snapshots: snapshots, layers: map[string]int64{}}
}

// Attach connects the manager whose sandboxes hold write layers and counts
// the sandboxes it already has (adopted after a restart). Call it after
// Recover and before creates.
func (d *Disk) Attach(m *Manager) {
	if d == nil {
		return
	}
	sbs := m.List(Filter{})
	d.mu.Lock()
	defer d.mu.Unlock()
	d.m = m
	for _, sb := range sbs {
		d.layers[sb.ID] = int64(sb.DiskMB) << 20
	}
}

// Budget is the budget in bytes (0: none).
func (d *Disk) Budget() int64 {
	if d == nil {
		return 0
	}
	return d.budget
}

// Use returns what counts against the budget now.
func (d *Disk) Use() DiskUse {
	if d == nil {
		return DiskUse{}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.useLocked()
}

// useLocked sums the live sandboxes' layers, dropping those gone, and the
// templates, snapshots and reservations. Callers hold d.mu.
func (d *Disk) useLocked() DiskUse {
	u := DiskUse{Pending: d.pending}
	if d.m != nil {
		d.m.mu.Lock()
		for id, n := range d.layers {
			_, live := d.m.boxes[id]
			_, dying := d.m.dying[id]
			if !live && !dying {
				delete(d.layers, id)
				continue
			}
			u.Layers += n
		}
		d.m.mu.Unlock()
	}
	if d.templates != nil {
		u.Templates = d.templates()
	}
	if d.snapshots != nil {
		u.Snapshots = d.snapshots()
	}
	return u
}

// Reserve admits bytes for work in progress (a template build's files, a
// snapshot's checkpoint) and holds them until release (safe to call more
// than once), by when what the work left counts on its own.
func (d *Disk) Reserve(what string, bytes int64) (release func(), err error) {
	if d == nil || d.budget <= 0 || bytes <= 0 {
		return func() {}, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := checkDisk(d.budget, d.useLocked(), bytes, what); err != nil {
		return nil, err
	}
	d.pending += bytes
	var once sync.Once
	return func() {
		once.Do(func() {
			d.mu.Lock()
			d.pending -= bytes
			d.mu.Unlock()
		})
	}, nil
}

// fits says whether bytes more fit in the budget now, reserving nothing.
func (d *Disk) fits(bytes int64, what string) error {
	if d == nil || d.budget <= 0 || bytes <= 0 {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return checkDisk(d.budget, d.useLocked(), bytes, what)
}

// layerClaim is a new sandbox's write layer, admitted: pending until the
// sandbox is known by its ID (bind), then counted as long as it lives.
type layerClaim struct {
	d     *Disk
	bytes int64
	mu    sync.Mutex
	done  bool
}

// claimLayer admits a write layer of diskMB for what.
func (d *Disk) claimLayer(diskMB int, what string) (*layerClaim, error) {
	bytes := int64(diskMB) << 20
	if d == nil || d.budget <= 0 || bytes <= 0 {
		return &layerClaim{}, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := checkDisk(d.budget, d.useLocked(), bytes, what); err != nil {
		return nil, err
	}
	d.pending += bytes
	return &layerClaim{d: d, bytes: bytes}, nil
}

// bind counts the layer as sandbox id's from now on; call it once the
// sandbox is in the manager's table, without holding the manager's lock.
func (c *layerClaim) bind(id string) {
	c.finish(id)
}

// release gives back a claim never bound (the create failed); after bind
// it does nothing.
func (c *layerClaim) release() { c.finish("") }

func (c *layerClaim) finish(id string) {
	if c == nil || c.d == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return
	}
	c.done = true
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	c.d.pending -= c.bytes
	if id != "" {
		c.d.layers[id] = c.bytes
	}
}

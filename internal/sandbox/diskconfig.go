package sandbox

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"syscall"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/template"
)

// DiskBudget is the operator's --disk-budget as given: a size, or a share
// of what agentenv can have on the data directory's filesystem. It caps
// what agentenv holds (see Disk); the zero value means no cap beyond the
// reserve.
type DiskBudget struct {
	Bytes   int64
	Percent float64
}

// DefaultDiskBudget is the CLI's default: no cap of its own. What is used
// is measured, and the filesystem's reserve (DefaultDiskReserve) is what
// keeps the host's disk from filling.
const DefaultDiskBudget = "none"

// ParseDiskBudget reads a --disk-budget: "N%" (of the data filesystem), a
// size in bytes with an optional binary suffix (K, M, G, T: "500G"), or 0
// (or "none") for no budget.
func ParseDiskBudget(s string) (DiskBudget, error) {
	s = strings.TrimSpace(s)
	if s == "none" {
		return DiskBudget{}, nil
	}
	bad := errdefs.Invalid("--disk-budget %q: give a size (500G, 80000M), a share of the data filesystem (90%%), or none", s)
	pct, n, err := parseShareOrSize(s)
	if err != nil {
		return DiskBudget{}, bad
	}
	return DiskBudget{Bytes: n, Percent: pct}, nil
}

// parseShareOrSize reads "N%" (0 < N <= 100) or a size.
func parseShareOrSize(s string) (float64, int64, error) {
	if p, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || f <= 0 || f > 100 || math.IsNaN(f) {
			return 0, 0, fmt.Errorf("share %q: give a percentage above 0 and at most 100", s)
		}
		return f, 0, nil
	}
	n, err := ParseSize(s)
	return 0, n, err
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

// DiskReserve is the operator's --disk-reserve: the free space kept on the
// data directory's filesystem, as a size or a share of the filesystem's
// size. New work that would go below it is refused.
type DiskReserve struct {
	Bytes   int64
	Percent float64
}

// DefaultDiskReserve is the CLI's default reserve, 2 GiB, on top of what
// the filesystem keeps for root (ext4: 5 %), which admission never counts
// as free. It is room for what no admission sees: sandboxes' write layers
// growing between admissions (thin provisioning), logs, runsc state,
// sandbox records, and other programs. A fixed size and not a share,
// because what it absorbs does not grow with the disk: 2 GiB is a few
// seconds of every sandbox writing at once, and a share of a large disk
// would hold back tens of GiB that the work needs.
const DefaultDiskReserve = "2G"

// ParseDiskReserve reads a --disk-reserve: a size ("2G"), a share of the
// data filesystem's size ("5%"), or 0 (no reserve: work is admitted until
// the filesystem is full).
func ParseDiskReserve(s string) (DiskReserve, error) {
	pct, n, err := parseShareOrSize(strings.TrimSpace(s))
	if err != nil {
		return DiskReserve{}, errdefs.Invalid("--disk-reserve %q: give a size (2G, 500M), a share of the data filesystem's size (5%%), or 0 for none", s)
	}
	return DiskReserve{Bytes: n, Percent: pct}, nil
}

func (r DiskReserve) String() string {
	if r.Percent > 0 {
		return strconv.FormatFloat(r.Percent, 'f', -1, 64) + "%"
	}
	return FormatBytes(r.Bytes)
}

// Resolve turns the reserve into bytes for the filesystem of dir.
func (r DiskReserve) Resolve(dir string) (int64, error) {
	if r.Percent <= 0 {
		return r.Bytes, nil
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("disk reserve: %w", err)
	}
	return int64(r.Percent / 100 * float64(int64(st.Blocks)*st.Bsize)), nil
}

// FormatBytes writes n in binary units: "512 B", "64.0 MiB", "10.0 GiB".
func FormatBytes(n int64) string {
	const unit = 1 << 10
	if n < 0 {
		return "-" + FormatBytes(-n)
	}
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

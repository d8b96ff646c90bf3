package bench

import (
	"fmt"
	"slices"
	"strings"
)

// Operation names one measured row (a stable key for JSON output).
type Operation string

// The measured rows.
const (
	OpCreate      Operation = "create"
	OpExec        Operation = "exec"
	OpFile        Operation = "write_read_1mib"
	OpKill        Operation = "kill"
	OpPause       Operation = "pause"
	OpResume      Operation = "resume"
	OpSnapshot    Operation = "snapshot_idle"
	OpSnapshot64  Operation = "snapshot_dirty_64mib"
	OpSnapshot256 Operation = "snapshot_dirty_256mib"
	OpRestore     Operation = "restore"
	OpFork4       Operation = "fork_4"
	OpFork16      Operation = "fork_16"
	OpChurn       Operation = "churn"
	OpMemIdle     Operation = "memory_idle"
	OpMemFork     Operation = "memory_fork_child"
	OpProxyGet    Operation = "proxy_get_small"
	OpProxyDown   Operation = "proxy_download_mibps"
	OpProxyUp     Operation = "proxy_upload_mibps"
	OpDiskWrite   Operation = "disk_write_mibps"
)

// A template of one file built on the bench's template: its build, its
// own bytes, and creates from it and from the base, taking turns.
const (
	OpLayerBuild      Operation = "layer_build_1mib"
	OpLayerBytes      Operation = "layer_template_mib"
	OpLayerCreate     Operation = "layer_create"
	OpLayerBaseCreate Operation = "layer_base_create"
)

// A snapshot of a sandbox whose previous snapshot exists, 16 MiB changed
// since: its time, and the MiB it adds to disk.
const (
	OpSnapIncr   Operation = "snapshot_incremental_16mib"
	OpSnapStored Operation = "snapshot_incremental_stored_mib"
)

// Kind says what a row's values are.
type Kind int

// The kinds of rows.
const (
	KindTime      Kind = iota // latency samples in ms: p50 / p95 / max
	KindRate                  // a throughput in cycles per second
	KindMemory                // PSS in MiB per sandbox
	KindBandwidth             // MiB/s, median of a few transfers
	KindStorage               // MiB a snapshot adds to disk (median)
)

type opInfo struct {
	label string
	kind  Kind
	group string
}

var ops = map[Operation]opInfo{
	// Create boots a sandbox unless the server has a ready snapshot of the
	// template (serve --ready-templates); the table then says so.
	OpCreate:      {"create (boot) until a command runs", KindTime, GroupBasic},
	OpExec:        {"exec /bin/true", KindTime, GroupBasic},
	OpFile:        {"write + read 1 MiB", KindTime, GroupBasic},
	OpKill:        {"kill", KindTime, GroupBasic},
	OpPause:       {"pause", KindTime, GroupPause},
	OpResume:      {"resume", KindTime, GroupPause},
	OpSnapshot:    {"snapshot, idle", KindTime, GroupSnapshot},
	OpSnapshot64:  {"snapshot, 64 MiB dirty", KindTime, GroupDirty},
	OpSnapshot256: {"snapshot, 256 MiB dirty", KindTime, GroupDirty},
	OpSnapIncr:    {"snapshot after 16 MiB changed (incremental)", KindTime, GroupDirty},
	OpSnapStored:  {"bytes stored per incremental snapshot (MiB)", KindStorage, GroupDirty},
	OpRestore:     {"restore until a command runs", KindTime, GroupRestore},
	OpFork4:       {"fork 4, until each child ran a command", KindTime, GroupFork},
	OpFork16:      {"fork 16, until each child ran a command", KindTime, GroupFork},
	OpChurn:       {"churn: create+exec+kill cycles/s", KindRate, GroupChurn},
	OpMemIdle:     {"memory per idle sandbox (PSS MiB)", KindMemory, GroupMemory},
	OpMemFork:     {"memory per fork child (PSS MiB)", KindMemory, GroupMemory},
	OpProxyGet:    {"request through the proxy (small GET)", KindTime, GroupNetwork},
	OpProxyDown:   {"throughput sandbox → proxy (MiB/s)", KindBandwidth, GroupNetwork},
	OpProxyUp:     {"throughput proxy → sandbox upload (MiB/s)", KindBandwidth, GroupNetwork},
	OpDiskWrite:   {"disk write inside a sandbox, 256 MiB (MiB/s)", KindBandwidth, GroupDisk},
	// Create may restore the templates' ready snapshots, as OpCreate.
	OpLayerBuild:      {"build of a one-file (1 MiB) template on a cached base", KindTime, GroupLayers},
	OpLayerBytes:      {"disk a one-file template adds (MiB)", KindStorage, GroupLayers},
	OpLayerCreate:     {"create from the one-file template", KindTime, GroupLayers},
	OpLayerBaseCreate: {"create from its base, in turn with it", KindTime, GroupLayers},
}

// Label is how the table names the row.
func (o Operation) Label() string {
	if i, ok := ops[o]; ok {
		return i.label
	}
	return string(o)
}

// Kind says what the row's values are.
func (o Operation) Kind() Kind { return ops[o].kind }

// Operations lists the rows in table order.
var Operations = []Operation{
	OpCreate, OpExec, OpFile, OpKill,
	OpPause, OpResume,
	OpSnapshot, OpSnapshot64, OpSnapshot256, OpSnapIncr, OpSnapStored,
	OpRestore, OpFork4, OpFork16,
	OpChurn, OpMemIdle, OpMemFork,
	OpProxyGet, OpProxyDown, OpProxyUp,
	OpDiskWrite,
	OpLayerBuild, OpLayerBytes, OpLayerCreate, OpLayerBaseCreate,
}

// Groups of rows that can be chosen with Config.Only.
const (
	GroupBasic    = "basic"    // create, exec, write + read, kill
	GroupPause    = "pause"    // pause, resume
	GroupSnapshot = "snapshot" // snapshot of an idle sandbox
	GroupRestore  = "restore"  // restore from a snapshot
	GroupFork     = "fork"     // fork 4, fork 16
	GroupDirty    = "dirty"    // snapshots with 64 and 256 MiB dirty, incremental snapshots
	GroupMemory   = "memory"   // PSS per idle sandbox and per fork child
	GroupChurn    = "churn"    // create+exec+kill throughput
	GroupNetwork  = "network"  // HTTP through the proxy to a server in a sandbox
	GroupDisk     = "disk"     // write throughput into the write layer
	GroupCPU      = "cpu"      // CPU per operation, all processes of the target
	GroupRollout  = "rollout"  // the RL rollout workload by parallelism
	GroupLayers   = "layers"   // a one-file template on the bench's: build, bytes, creates
	// GroupDensity starts a thousand idle sandboxes per target and probes
	// the host limits they approach; it takes minutes, so it runs only when
	// asked for.
	GroupDensity = "density"
	// GroupRL measures the doors RL training code calls (E2B's runCode,
	// SandboxFusion's run_code); on a fresh server it first builds two
	// templates (minutes), so it too runs only when asked for.
	GroupRL = "rl"
)

// Groups lists every group in the order they run.
var Groups = []string{GroupBasic, GroupPause, GroupSnapshot, GroupRestore, GroupFork, GroupDirty, GroupMemory, GroupChurn, GroupCPU, GroupRollout, GroupNetwork, GroupDisk, GroupLayers, GroupDensity, GroupRL}

// DefaultGroups are the groups a run without --only runs: all but density
// and rl.
var DefaultGroups = []string{GroupBasic, GroupPause, GroupSnapshot, GroupRestore, GroupFork, GroupDirty, GroupMemory, GroupChurn, GroupCPU, GroupRollout, GroupNetwork, GroupDisk, GroupLayers}

// ParseGroups turns a comma-separated list of groups into a set; empty
// means DefaultGroups.
func ParseGroups(s string) (map[string]bool, error) {
	out := map[string]bool{}
	if strings.TrimSpace(s) == "" {
		for _, g := range DefaultGroups {
			out[g] = true
		}
		return out, nil
	}
	for _, g := range strings.Split(s, ",") {
		g = strings.TrimSpace(g)
		if !slices.Contains(Groups, g) {
			return nil, fmt.Errorf("unknown bench group %q: choose from %s", g, strings.Join(Groups, ", "))
		}
		out[g] = true
	}
	return out, nil
}

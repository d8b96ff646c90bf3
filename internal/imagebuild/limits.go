package imagebuild

import (
	"fmt"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// Limits bound every build sandbox. A Spec's CPUs and MemoryMB replace
// CPUs and MemoryMB; the process cap and the maximum are the server's.
// Zero fields take DefaultLimits'.
type Limits struct {
	// CPUs is the CPU quota, in cores, of a build that asks for none.
	CPUs int
	// MemoryMB is the memory of a build that asks for none: the host
	// cgroup's limit, what the build sees as MemTotal, and twice the size
	// of its /dev/shm.
	MemoryMB int
	// Pids caps the processes of a build sandbox (lowered for small
	// memory, as for sandboxes).
	Pids int
	// MaxMemoryMB is the most memory a build may ask for.
	MaxMemoryMB int
	// MaxCPUs is the most CPUs a build may ask for.
	MaxCPUs int
}

// DefaultLimits are the limits of a Config that sets none.
var DefaultLimits = Limits{CPUs: 2, MemoryMB: 2048, Pids: 1024, MaxMemoryMB: 8192, MaxCPUs: 8}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.CPUs <= 0 {
		l.CPUs = d.CPUs
	}
	if l.MemoryMB <= 0 {
		l.MemoryMB = d.MemoryMB
	}
	if l.Pids <= 0 {
		l.Pids = d.Pids
	}
	if l.MaxMemoryMB <= 0 {
		l.MaxMemoryMB = max(d.MaxMemoryMB, l.MemoryMB)
	}
	if l.MaxCPUs <= 0 {
		l.MaxCPUs = max(d.MaxCPUs, l.CPUs)
	}
	return l
}

// hostBytesPerProcess is what one process inside gVisor costs on the host
// (as the sandbox package measured it): the process cap is lowered so that
// processes alone use at most half the memory limit.
const hostBytesPerProcess = 528 << 10

// sandboxLimits are one build's: CPUs, memory in MiB and the process cap.
type sandboxLimits struct {
	cpus, memoryMB int
	pids           int64
}

// limitsFor returns the limits spec's sandboxes run with, or why spec
// asks for more than this server gives.
func (b *Builder) limitsFor(spec Spec) (sandboxLimits, error) {
	l := b.cfg.Limits
	out := sandboxLimits{cpus: l.CPUs, memoryMB: l.MemoryMB}
	if spec.CPUs > 0 {
		out.cpus = spec.CPUs
	}
	if spec.MemoryMB > 0 {
		out.memoryMB = spec.MemoryMB
	}
	if out.memoryMB > l.MaxMemoryMB {
		return out, errdefs.Invalid("memoryMB %d is more than this server gives a build (%d MiB): ask for less", out.memoryMB, l.MaxMemoryMB)
	}
	if out.cpus > l.MaxCPUs {
		return out, errdefs.Invalid("cpuCount %d is more than this server gives a build (%d): ask for less", out.cpus, l.MaxCPUs)
	}
	out.pids = int64(l.Pids)
	if byMem := int64(out.memoryMB) << 20 / 2 / hostBytesPerProcess; byMem < out.pids {
		out.pids = max(byMem, 32)
	}
	return out, nil
}

// apply puts the limits into a build sandbox's spec: the host cgroup's
// CPU quota, memory and pids (a backstop: gVisor enforces RLIMIT_NPROC
// itself, and hitting the pids cgroup would crash the sandbox), the
// process's RLIMIT_NPROC (hard, so a step cannot raise it), and a
// /dev/shm of half the memory, so filling it fails a write rather than
// the sandbox (gVisor's tmpfs would otherwise size it by the host's RAM).
func (l sandboxLimits) apply(spec *specs.Spec) {
	limit := int64(l.memoryMB) << 20
	period := uint64(100000)
	quota := int64(l.cpus) * int64(period)
	spec.Linux.Resources = &specs.LinuxResources{
		Memory: &specs.LinuxMemory{Limit: &limit},
		CPU:    &specs.LinuxCPU{Period: &period, Quota: &quota},
		Pids:   &specs.LinuxPids{Limit: 3*l.pids + 128},
	}
	spec.Process.Rlimits = append(spec.Process.Rlimits,
		specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: uint64(l.pids), Soft: uint64(l.pids)})
	for i := range spec.Mounts {
		if spec.Mounts[i].Destination == "/dev/shm" {
			spec.Mounts[i].Options = append(spec.Mounts[i].Options, fmt.Sprintf("size=%dk", limit/2>>10))
		}
	}
}

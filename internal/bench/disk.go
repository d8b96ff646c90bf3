package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentenv/agentenv/internal/runtime/ocispec"
	"github.com/agentenv/agentenv/internal/runtime/runscbin"
)

// The disk row: a sandbox writes a file into its write layer (dd from
// /dev/zero, 1 MiB blocks), timed from the host around the exec.
const (
	diskMiB       = 256 // MiB per write
	diskTransfers = 3   // writes per target
)

// diskScript writes diskMiB into the write layer and removes the file, so
// the next write starts from the same empty layer.
var diskScript = fmt.Sprintf("dd if=/dev/zero of=/tmp/diskbench bs=1M count=%d 2>/dev/null && rm /tmp/diskbench", diskMiB)

// diskWrite measures the write throughput into the write layer of an
// agentenv sandbox and of a raw runsc container given the same layer (the
// disk size agentenv reports for its sandbox; memory when it has none).
func (r *runner) diskWrite(ctx context.Context) (err error) {
	a := r.ts.agentenv
	r.progressf("disk: %d writes of %d MiB into a sandbox's write layer", diskTransfers, diskMiB)
	id, err := a.boot(ctx, 0)
	if err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	defer func() {
		if kerr := killAll(ctx, a, []string{id}); kerr != nil {
			err = errors.Join(err, fmt.Errorf("kill %s: %w", id, kerr))
		}
	}()
	sb, err := r.cfg.Client.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	times, err := timeWrites(ctx, func(ctx context.Context) error { return a.sh(ctx, id, diskScript) })
	if err != nil {
		return fmt.Errorf("agentenv: %w", err)
	}
	r.setDiskBandwidth(TargetAgentenv, times)
	layer := "memory"
	if sb.DiskSizeMB > 0 {
		layer = fmt.Sprintf("a %d MiB file on the host's disk", sb.DiskSizeMB)
	}
	r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("disk: dd of %d MiB from /dev/zero into the write layer (%s), %d times, timed around the exec; runsc runs the same spec annotations", diskMiB, layer, diskTransfers))
	if r.ts.runsc == nil {
		return nil
	}
	times, err = r.ts.runsc.diskWrites(ctx, int64(sb.DiskSizeMB))
	if err != nil {
		return fmt.Errorf("runsc: %w", err)
	}
	r.setDiskBandwidth(TargetRunsc, times)
	return nil
}

func timeWrites(ctx context.Context, write func(context.Context) error) ([]time.Duration, error) {
	var times []time.Duration
	for i := range diskTransfers {
		start := time.Now()
		if err := write(ctx); err != nil {
			return nil, fmt.Errorf("write %d: %w", i+1, err)
		}
		times = append(times, time.Since(start))
	}
	return times, nil
}

func (r *runner) setDiskBandwidth(target string, times []time.Duration) {
	if r.rep.Bandwidth == nil {
		r.rep.Bandwidth = map[string]map[Operation]Bandwidth{}
	}
	if r.rep.Bandwidth[target] == nil {
		r.rep.Bandwidth[target] = map[Operation]Bandwidth{}
	}
	r.rep.Bandwidth[target][OpDiskWrite] = summarizeBandwidth(diskMiB, times)
}

// diskWrites starts a container whose spec is the target's with agentenv's
// write layer of diskMB (0: the memory layer it has), and times the writes.
func (r *runscTarget) diskWrites(ctx context.Context, diskMB int64) (_ []time.Duration, err error) {
	bundle := r.bundle
	if diskMB > 0 {
		if bundle, err = r.diskBundle(diskMB); err != nil {
			return nil, err
		}
	}
	id := r.newID()
	if err := r.tool.run(ctx, nil, nil, "run", "--detach", "--bundle", bundle, id); err != nil {
		return nil, errors.Join(err, r.kill(context.WithoutCancel(ctx), id))
	}
	defer func() { err = errors.Join(err, r.kill(context.WithoutCancel(ctx), id)) }()
	return timeWrites(ctx, func(ctx context.Context) error { return r.sh(ctx, id, diskScript) })
}

// diskBundle writes a copy of the target's bundle with the disk layer.
func (r *runscTarget) diskBundle(diskMB int64) (string, error) {
	b, err := os.ReadFile(filepath.Join(r.bundle, "config.json"))
	if err != nil {
		return "", err
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return "", err
	}
	bundle := filepath.Join(r.dir, "bundle-disk")
	root, anchor := filepath.Join(bundle, "rootfs"), filepath.Join(bundle, "anchor")
	for _, d := range []string{root, anchor} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	spec.Root.Path = root
	// As agentenv does: no gofer when the build can do without one.
	_, feat, err := runscbin.Version(r.tool.bin)
	if err != nil {
		return "", err
	}
	if feat.GoferlessFilestore {
		anchor = ""
	}
	ocispec.DiskLayer(&spec, diskMB, anchor)
	return bundle, writeBundle(bundle, spec)
}

package bench

import (
	"context"
	"time"
)

// How a cpuMeter decides that a target's processes have gone quiet: the
// work an operation leaves behind (a kill's teardown, a pool refilling
// after a restore) belongs to that operation, so a batch ends only once
// its target is back to idle.
const (
	quietWindow = 200 * time.Millisecond
	// quietFloor is the CPU per window that counts as quiet whatever the
	// idle rate (1 % of a core).
	quietFloor = 2 * time.Millisecond
	// quietMax bounds the wait: a target that never goes quiet is measured
	// anyway, its idle rate subtracted.
	quietMax   = 10 * time.Second
	idleWindow = time.Second
)

// cpuMeter counts the CPU one target's processes use over a piece of
// work, less what they use idle over the same time.
type cpuMeter struct {
	read  func() (time.Duration, error)
	now   func() time.Time
	sleep func(context.Context, time.Duration) error
	// idle is the target's CPU use at rest, in CPU seconds per second;
	// calibrate sets it.
	idle float64
}

func newCPUMeter(g *cpuGroup) *cpuMeter {
	return &cpuMeter{read: g.usage, now: time.Now, sleep: sleepCtx}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// quietLimit is the most CPU a quiet window may use.
func (m *cpuMeter) quietLimit() time.Duration {
	return max(quietFloor, time.Duration(2*m.idle*float64(quietWindow)))
}

// waitQuiet returns, with the usage and time at that point, once a whole
// window used no more than quietLimit, or after quietMax.
func (m *cpuMeter) waitQuiet(ctx context.Context) (time.Duration, time.Time, error) {
	start := m.now()
	prev, err := m.read()
	if err != nil {
		return 0, time.Time{}, err
	}
	for {
		if err := m.sleep(ctx, quietWindow); err != nil {
			return 0, time.Time{}, err
		}
		u, err := m.read()
		if err != nil {
			return 0, time.Time{}, err
		}
		now := m.now()
		if u-prev <= m.quietLimit() || now.Sub(start) >= quietMax {
			return u, now, nil
		}
		prev = u
	}
}

// calibrate measures the target's idle rate once it is quiet.
func (m *cpuMeter) calibrate(ctx context.Context) error {
	m.idle = 0
	u0, t0, err := m.waitQuiet(ctx)
	if err != nil {
		return err
	}
	if err := m.sleep(ctx, idleWindow); err != nil {
		return err
	}
	u1, err := m.read()
	if err != nil {
		return err
	}
	m.idle = rate(u1-u0, m.now().Sub(t0))
	return nil
}

// measure runs f between two quiet points and returns the CPU used
// between them less idle, and how long f took.
func (m *cpuMeter) measure(ctx context.Context, f func(context.Context) error) (cpu, wall time.Duration, err error) {
	u0, t0, err := m.waitQuiet(ctx)
	if err != nil {
		return 0, 0, err
	}
	if err := f(ctx); err != nil {
		return 0, 0, err
	}
	wall = m.now().Sub(t0)
	u1, t1, err := m.waitQuiet(ctx)
	if err != nil {
		return 0, 0, err
	}
	return netCPU(u1-u0, m.idle, t1.Sub(t0)), wall, nil
}

// rate is CPU seconds per second.
func rate(used, over time.Duration) float64 {
	if over <= 0 {
		return 0
	}
	return used.Seconds() / over.Seconds()
}

// netCPU is used less idle (CPU seconds per second) over elapsed, never
// below zero.
func netCPU(used time.Duration, idle float64, elapsed time.Duration) time.Duration {
	return max(used-time.Duration(idle*float64(elapsed)), 0)
}

package sandboxfusion

import (
	"context"
	"log/slog"
	"time"

	"github.com/agentenv/agentenv/client"
)

// A pooled sandbox lives poolLife and is handed out only during its first
// poolMaxAge, so a call always has the rest (at least maxCallTime) left.
const (
	poolLife   = 30 * time.Minute
	poolMaxAge = poolLife - maxCallTime - time.Minute
	// poolWorkers create pooled sandboxes at once: creates cost CPU, and
	// a drained pool is refilled while calls create their own.
	poolWorkers = 2
)

type pooled struct {
	sb client.Sandbox
	at time.Time
}

// pool keeps sandboxes created ahead, each handed out once.
type pool struct {
	memMB  int
	create func(ctx context.Context, memMB int, life time.Duration) (client.Sandbox, error)
	kill   func(id string)
	log    *slog.Logger
	ready  chan pooled
	want   chan struct{}
}

func newPool(size, memMB int, create func(context.Context, int, time.Duration) (client.Sandbox, error), kill func(string), log *slog.Logger) *pool {
	return &pool{memMB: memMB, create: create, kill: kill, log: log,
		ready: make(chan pooled, max(size, 0)), want: make(chan struct{}, poolWorkers)}
}

// take hands out a pooled sandbox of memMB, if one is ready.
func (p *pool) take(memMB int) (client.Sandbox, bool) {
	if memMB != p.memMB {
		return client.Sandbox{}, false
	}
	defer p.wake()
	for {
		select {
		case e := <-p.ready:
			if time.Since(e.at) > poolMaxAge {
				go p.kill(e.sb.SandboxID)
				continue
			}
			return e.sb, true
		default:
			return client.Sandbox{}, false
		}
	}
}

func (p *pool) wake() {
	select {
	case p.want <- struct{}{}:
	default:
	}
}

// run keeps the pool full until ctx ends, then kills what it holds.
func (p *pool) run(ctx context.Context) {
	if cap(p.ready) == 0 {
		return
	}
	done := make(chan struct{})
	for range poolWorkers {
		go func() {
			defer func() { done <- struct{}{} }()
			p.fill(ctx)
		}()
	}
	for range poolWorkers {
		<-done
	}
	for {
		select {
		case e := <-p.ready:
			p.kill(e.sb.SandboxID)
		default:
			return
		}
	}
}

func (p *pool) fill(ctx context.Context) {
	sweep := time.NewTicker(time.Minute)
	defer sweep.Stop()
	for ctx.Err() == nil {
		if len(p.ready) < cap(p.ready) {
			sb, err := p.create(ctx, p.memMB, poolLife)
			if err != nil {
				if ctx.Err() == nil {
					p.log.Warn("sandboxfusion: create a pooled runner sandbox", "err", err)
				}
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
				continue
			}
			select {
			case p.ready <- pooled{sb: sb, at: time.Now()}:
			default: // another worker filled the last place
				go p.kill(sb.SandboxID)
			}
			continue
		}
		select {
		case <-ctx.Done():
		case <-p.want:
		case <-sweep.C:
			p.dropStale()
		}
	}
}

// dropStale kills the pooled sandboxes past poolMaxAge.
func (p *pool) dropStale() {
	for range len(p.ready) {
		select {
		case e := <-p.ready:
			if time.Since(e.at) > poolMaxAge {
				go p.kill(e.sb.SandboxID)
				continue
			}
			select {
			case p.ready <- e:
			default:
				go p.kill(e.sb.SandboxID)
			}
		default:
			return
		}
	}
}

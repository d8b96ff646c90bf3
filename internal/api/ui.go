package api

import (
	"context"
	_ "embed"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/agentenv/agentenv/internal/metrics"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/service"
)

// The live page (/ui): one self-contained HTML file (no CDN, no build
// step) that polls /ui/data with the caller's key. The page holds no data
// and is served to anyone; everything it shows comes from /ui/data, which
// needs an API key (its own sandboxes) or the operator key (all).

//go:embed ui/index.html
var uiPage []byte

// uiTopMax caps the running sandboxes sampled for the CPU/memory top.
const uiTopMax = 200

type uiSandbox struct {
	ID        string            `json:"id"`
	Template  string            `json:"template"`
	State     string            `json:"state"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	StartedAt time.Time         `json:"startedAt"`
	EndAt     time.Time         `json:"endAt"`
	CPUs      int               `json:"cpus"`
	MemoryMB  int               `json:"memoryMB"`
	// Sampled says CPUPct and MemUsed were read now (running sandboxes).
	Sampled  bool    `json:"sampled"`
	CPUPct   float64 `json:"cpuPct"`
	MemUsed  int64   `json:"memUsed"`
	MemTotal int64   `json:"memTotal"`
}

type uiData struct {
	Now time.Time `json:"now"`
	// Key is the caller's key name (named keys); All says it sees every
	// key's sandboxes (the single key, the operator).
	Key       string       `json:"key,omitempty"`
	All       bool         `json:"all"`
	Sandboxes []uiSandbox  `json:"sandboxes"`
	Live      metrics.Live `json:"live"`
}

func (s *Server) uiPage(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	// The page runs only its own inline script and talks only to this
	// server; it must not be framed (the key is in its storage).
	w.Header().Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; frame-ancestors 'none'")
	w.Write(uiPage)
}

// uiData answers GET /ui/data: the caller's sandboxes with a CPU and
// memory sample of each running one, and the registry's live history.
func (s *Server) uiData(w http.ResponseWriter, r *http.Request) {
	id := identityOf(r.Context())
	b := s.backend(r)
	sbs, err := b.List(r.Context(), sandbox.Filter{})
	if err != nil {
		writeError(w, err)
		return
	}
	out := uiData{Now: time.Now().UTC(), Key: id.Name, All: id.all(), Sandboxes: make([]uiSandbox, 0, len(sbs)), Live: s.cfg.Metrics.Live()}
	for _, sb := range sbs {
		if sb.State == sandbox.StatePooled {
			continue
		}
		out.Sandboxes = append(out.Sandboxes, uiSandbox{
			ID: sb.ID, Template: sb.Template, State: string(sb.State.E2B()), Metadata: sb.Metadata,
			StartedAt: sb.StartedAt, EndAt: sb.EndAt, CPUs: sb.CPUs, MemoryMB: sb.MemoryMB,
		})
	}
	sampleTop(r.Context(), b, out.Sandboxes)
	writeJSON(w, http.StatusOK, out)
}

// sampleTop samples the running sandboxes (the newest uiTopMax), 8 at a
// time, each within 2 s: a slow node leaves its sandboxes unsampled
// rather than stalling the page.
func sampleTop(ctx context.Context, b service.Backend, sbs []uiSandbox) {
	var running []int
	for i := range sbs {
		if sbs[i].State == string(sandbox.StateRunning) {
			running = append(running, i)
		}
	}
	sort.Slice(running, func(a, b int) bool { return sbs[running[a]].StartedAt.After(sbs[running[b]].StartedAt) })
	if len(running) > uiTopMax {
		running = running[:uiTopMax]
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, i := range running {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			m, err := b.Metrics(cctx, sbs[i].ID)
			if err != nil || m.Timestamp.IsZero() {
				return
			}
			sbs[i].Sampled, sbs[i].CPUPct, sbs[i].MemUsed, sbs[i].MemTotal = true, m.CPUUsedPct, m.MemUsed, m.MemTotal
		})
	}
	wg.Wait()
}

package api

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	wire "github.com/agentenv/agentenv/client/api"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/sandbox"
)

// toMetricJSON is a sample as the API shows it (E2B's SandboxMetric).
func toMetricJSON(m sandbox.Metric) wire.SandboxMetric {
	return wire.SandboxMetric{
		Timestamp: m.Timestamp, TimestampUnix: m.Timestamp.Unix(), CPUCount: m.CPUCount,
		CPUUsedPct: m.CPUUsedPct, MemUsed: m.MemUsed, MemTotal: m.MemTotal, MemCache: m.MemCache,
		DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal,
	}
}

// sandboxMetrics answers GET /sandboxes/{id}/metrics: agentenv keeps no
// history, so the list holds one sample taken now, or none when the
// asked interval (start, end: Unix seconds) does not include now.
func (s *Server) sandboxMetrics(w http.ResponseWriter, r *http.Request) {
	inside, err := intervalHoldsNow(r.URL.Query(), time.Now())
	if err != nil {
		writeError(w, err)
		return
	}
	m, err := s.backend(r).Metrics(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	out := []wire.SandboxMetric{}
	if inside && !m.Timestamp.IsZero() {
		out = append(out, toMetricJSON(m))
	}
	writeJSON(w, http.StatusOK, out)
}

// intervalHoldsNow reads the optional start and end (Unix seconds).
func intervalHoldsNow(q url.Values, now time.Time) (bool, error) {
	bound := func(name string) (int64, bool, error) {
		v := q.Get(name)
		if v == "" {
			return 0, false, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return 0, false, errdefs.Invalid("%s %q: give a Unix time in seconds", name, v)
		}
		return n, true, nil
	}
	start, hasStart, err := bound("start")
	if err != nil {
		return false, err
	}
	end, hasEnd, err := bound("end")
	if err != nil {
		return false, err
	}
	sec := now.Unix()
	return (!hasStart || start <= sec) && (!hasEnd || sec <= end), nil
}

// maxMetricsIDs is E2B's cap on sandbox_ids.
const maxMetricsIDs = 100

// sandboxesMetrics answers GET /sandboxes/metrics?sandbox_ids=a,b: the
// latest sample of each sandbox that exists (others are left out).
func (s *Server) sandboxesMetrics(w http.ResponseWriter, r *http.Request) {
	ids, err := metricsIDs(r.URL.Query()["sandbox_ids"])
	if err != nil {
		writeError(w, err)
		return
	}
	var (
		mu   sync.Mutex
		out  = map[string]wire.SandboxMetric{}
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, 8) // a fleet sends each to its node
	)
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			m, err := s.backend(r).Metrics(r.Context(), id)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && !m.Timestamp.IsZero():
				out[id] = toMetricJSON(m)
			case err == nil: // nothing runs in it (paused without memory)
			case !errors.Is(err, errdefs.ErrNotFound):
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		writeError(w, errs[0])
		return
	}
	writeJSON(w, http.StatusOK, wire.SandboxesMetrics{Sandboxes: out})
}

// metricsIDs reads sandbox_ids: comma-separated (E2B's form) or repeated.
func metricsIDs(vals []string) ([]string, error) {
	seen := map[string]bool{}
	var ids []string
	for _, v := range vals {
		for _, id := range strings.Split(v, ",") {
			if id = strings.TrimSpace(id); id != "" && !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
	}
	if len(ids) == 0 {
		return nil, errdefs.Invalid("sandbox_ids is required: give the sandbox IDs, comma-separated")
	}
	if len(ids) > maxMetricsIDs {
		return nil, errdefs.Invalid("sandbox_ids has %d IDs: give at most %d per request", len(ids), maxMetricsIDs)
	}
	return ids, nil
}

// Scrape serves h (the role's Prometheus /metrics) only to a key that sees
// every tenant: the operator's, or the single key of a one-user server.
// The series count every tenant's sandboxes by template, so neither a
// keyless caller nor a named key may read them.
func (s *Server) Scrape(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := s.caller(r)
		if err == nil && !id.all() {
			err = fmt.Errorf("/metrics counts every key's sandboxes and templates: scrape it with the operator key (or the server's single API key), not a named key: %w", errdefs.ErrPermissionDenied)
		}
		if err != nil {
			writeError(w, err)
			return
		}
		h.ServeHTTP(w, r)
	})
}

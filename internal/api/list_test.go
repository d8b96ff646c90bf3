package api

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/sandbox"
)

func listed(n int, t0 time.Time) []sandbox.Sandbox {
	var out []sandbox.Sandbox
	for i := range n {
		// Pairs share a start time, so the ID decides their order.
		out = append(out, sandbox.Sandbox{ID: fmt.Sprintf("sb%03d", i), State: sandbox.StateRunning,
			StartedAt: t0.Add(time.Duration(i/2) * time.Second), Template: "busybox"})
	}
	return out
}

func ids(sbs []sandbox.Sandbox) []string {
	var out []string
	for _, sb := range sbs {
		out = append(out, sb.ID)
	}
	return out
}

func mustQuery(t *testing.T, raw string) listQuery {
	t.Helper()
	q, err := url.ParseQuery(raw)
	if err != nil {
		t.Fatal(err)
	}
	lq, err := parseListQuery(q, true)
	if err != nil {
		t.Fatalf("parseListQuery(%q): %v", raw, err)
	}
	return lq
}

// TestListPagesWhileSandboxesComeAndGo pages through a list while
// sandboxes are created and killed between pages: every sandbox that
// lives through the whole walk is seen exactly once, in order.
func TestListPagesWhileSandboxesComeAndGo(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, order := range []string{"asc", "desc", ""} {
		t.Run(order, func(t *testing.T) {
			all := listed(25, t0)
			survivors := map[string]bool{}
			for _, sb := range all {
				survivors[sb.ID] = true
			}
			var seen []string
			tok := ""
			for page := 0; ; page++ {
				raw := "limit=4&order=" + order
				if tok != "" {
					raw += "&nextToken=" + url.QueryEscape(tok)
				}
				p := mustQuery(t, raw).page(all)
				if len(p.items) > 4 {
					t.Fatalf("page %d: got %d items, want at most 4", page, len(p.items))
				}
				seen = append(seen, ids(p.items)...)
				if p.next == "" {
					break
				}
				tok = p.next
				// Between pages: kill the last sandbox just listed (the
				// token's own item) and one not listed yet, and create one.
				last := p.items[len(p.items)-1].ID
				all = slices.DeleteFunc(all, func(sb sandbox.Sandbox) bool { return sb.ID == last })
				delete(survivors, last)
				all = append(all, sandbox.Sandbox{ID: fmt.Sprintf("new%02d", page), State: sandbox.StateRunning,
					StartedAt: t0.Add(time.Hour + time.Duration(page)*time.Second)})
				if page == 1 {
					all = slices.DeleteFunc(all, func(sb sandbox.Sandbox) bool { return sb.ID == "sb012" })
					delete(survivors, "sb012")
				}
			}
			count := map[string]int{}
			for _, id := range seen {
				count[id]++
			}
			for id := range survivors {
				if count[id] != 1 {
					t.Errorf("sandbox %s listed %d times, want once", id, count[id])
				}
			}
			for id, n := range count {
				if n > 1 {
					t.Errorf("sandbox %s listed %d times, want once", id, n)
				}
			}
			want := slices.Clone(seen)
			slices.Sort(want)
			if order != "asc" {
				slices.Reverse(want)
			}
			// Only the old sandboxes (all named sbNNN, named in start order) count for the order.
			old := slices.DeleteFunc(slices.Clone(seen), func(id string) bool { return id[:2] != "sb" })
			wantOld := slices.DeleteFunc(want, func(id string) bool { return id[:2] != "sb" })
			if !slices.Equal(old, wantOld) {
				t.Errorf("got order %v, want %v", old, wantOld)
			}
		})
	}
}

func TestListDefaultsNewestFirstOneFullPage(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	all := listed(130, t0)
	p := mustQuery(t, "").page(all)
	if len(p.items) != defaultPageLimit || p.next == "" {
		t.Fatalf("got %d items and next %q, want %d and a token", len(p.items), p.next, defaultPageLimit)
	}
	if got, want := p.items[0].ID, "sb129"; got != want {
		t.Errorf("got first %s, want the newest %s", got, want)
	}
	if p.totalRunning != 130 {
		t.Errorf("got totalRunning %d, want 130 (before paging)", p.totalRunning)
	}
	rest := mustQuery(t, "nextToken="+url.QueryEscape(p.next)).page(all)
	if len(rest.items) != 30 || rest.next != "" {
		t.Errorf("got %d items and next %q on the last page, want 30 and none", len(rest.items), rest.next)
	}
}

func TestListFilters(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	all := listed(10, t0)
	all[3].Template, all[7].Template = "debian", "debian"
	all[9].State = sandbox.StatePaused
	cases := []struct {
		query string
		want  []string
	}{
		{"template=debian&order=asc", []string{"sb003", "sb007"}},
		{"startedAfter=" + url.QueryEscape(t0.Add(3*time.Second).Format(time.RFC3339)), []string{"sb009", "sb008", "sb007", "sb006"}},
		{"startedAfter=2026-12-01T00:00:03.5Z", []string{"sb009", "sb008"}},
	}
	for _, c := range cases {
		lq := mustQuery(t, c.query)
		// The backend applies the filter (Filter.Match), the pager orders.
		var matched []sandbox.Sandbox
		for _, sb := range all {
			if lq.filter.Match(sb) {
				matched = append(matched, sb)
			}
		}
		if got := ids(lq.page(matched).items); !slices.Equal(got, c.want) {
			t.Errorf("%s: got %v, want %v", c.query, got, c.want)
		}
	}
	// States are filtered by the backend (Filter); check what reaches it.
	for raw, want := range map[string][]sandbox.State{
		"":                            {sandbox.StateRunning, sandbox.StatePaused},
		"state=paused":                {sandbox.StatePaused},
		"state=running,paused":        {sandbox.StateRunning, sandbox.StatePaused},
		"state=running&state=paused":  {sandbox.StateRunning, sandbox.StatePaused},
		"metadata=k%3Dv&state=paused": {sandbox.StatePaused},
	} {
		if got := mustQuery(t, raw).filter.States; !slices.Equal(got, want) {
			t.Errorf("%q: got states %v, want %v", raw, got, want)
		}
	}
}

func TestListRejectsBadParameters(t *testing.T) {
	for _, raw := range []string{
		"limit=0", "limit=101", "limit=x", "order=up", "state=stopped",
		"startedAfter=yesterday", "nextToken=!!", "nextToken=" + url.QueryEscape(pageKey{1, ""}.encode()),
		"nextToken=bm90LWEtbnVtYmVyOng",
	} {
		q, _ := url.ParseQuery(raw)
		if _, err := parseListQuery(q, true); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%q: got %v, want an ErrInvalid", raw, err)
		}
	}
	// The v1 route does not page: limit is not read.
	q, _ := url.ParseQuery("limit=1000")
	if lq, err := parseListQuery(q, false); err != nil || lq.limit != 0 {
		t.Errorf("v1 limit=1000: got limit %d, err %v; want no paging", lq.limit, err)
	}
}

// BenchmarkListPage is one page of 100 out of 22,000 sandboxes (the fleet
// scale test's size), first and later pages.
func BenchmarkListPage(b *testing.B) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	all := listed(22000, t0)
	rand.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	lq := listQuery{desc: true, limit: 100}
	mid := listQuery{desc: true, limit: 100, after: &pageKey{t0.Add(5000 * time.Second).UnixNano(), "sb10000"}}
	b.Run("first", func(b *testing.B) {
		for b.Loop() {
			lq.page(all)
		}
	})
	b.Run("middle", func(b *testing.B) {
		for b.Loop() {
			mid.page(all)
		}
	})
}

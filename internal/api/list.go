package api

import (
	"container/heap"
	"encoding/base64"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/sandbox"
)

// Listing follows E2B's GET /v2/sandboxes: filters (metadata, state,
// template, startedAfter), newest first unless order=asc, and pages of at
// most limit (1–100, default 100) items chained by the X-Next-Token header.
//
// Paging is done here, over Backend.List, so that `agentenv serve` and a
// fleet API server page alike. Items are ordered by (startedAt, sandboxID),
// and a token names the key of the last item a page gave: the next page is
// what comes strictly after that key. A sandbox created or killed between
// two pages therefore neither shifts nor repeats the others.

const (
	defaultPageLimit = 100
	maxPageLimit     = 100
)

// listQuery is a parsed list request.
type listQuery struct {
	filter sandbox.Filter
	desc   bool
	limit  int // 0: no paging (the v1 route)
	after  *pageKey
}

// pageKey is the position of one sandbox in the list order.
type pageKey struct {
	startedAt int64 // Unix nanoseconds
	id        string
}

func keyOf(sb sandbox.Sandbox) pageKey { return pageKey{sb.StartedAt.UnixNano(), sb.ID} }

// less orders keys by start time, then ID (IDs are unique).
func (k pageKey) less(o pageKey) bool {
	if k.startedAt != o.startedAt {
		return k.startedAt < o.startedAt
	}
	return k.id < o.id
}

// encode makes the opaque token the client sends back as nextToken.
func (k pageKey) encode() string {
	raw := strconv.FormatInt(k.startedAt, 10) + ":" + k.id
	return base64.RawURLEncoding.EncodeToString([]byte(raw))
}

func decodePageKey(tok string) (pageKey, error) {
	bad := errdefs.Invalid("nextToken %q is not a token this server gave out: pass the X-Next-Token header of the previous page unchanged, or leave nextToken out to start again", tok)
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return pageKey{}, bad
	}
	ns, id, ok := strings.Cut(string(raw), ":")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || id == "" {
		return pageKey{}, bad
	}
	return pageKey{n, id}, nil
}

// parseListQuery reads the list parameters. paged is false for the v1
// route, which E2B answers in one piece.
func parseListQuery(q url.Values, paged bool) (listQuery, error) {
	lq := listQuery{desc: true}
	if m := q.Get("metadata"); m != "" {
		md, err := parseMetadata(m)
		if err != nil {
			return lq, err
		}
		lq.filter.Metadata = md
	}
	states, err := parseStates(q["state"])
	if err != nil {
		return lq, err
	}
	lq.filter.States = states
	lq.filter.Template = q.Get("template")
	if s := q.Get("startedAfter"); s != "" {
		if lq.filter.StartedAfter, err = time.Parse(time.RFC3339Nano, s); err != nil {
			return lq, errdefs.Invalid("startedAfter %q: give an RFC 3339 time such as 2026-01-02T15:04:05Z", s)
		}
	}
	switch o := q.Get("order"); o {
	case "", "desc":
	case "asc":
		lq.desc = false
	default:
		return lq, errdefs.Invalid("order %q: use asc (oldest first) or desc (newest first, the default)", o)
	}
	if !paged {
		return lq, nil
	}
	lq.limit = defaultPageLimit
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxPageLimit {
			return lq, errdefs.Invalid("limit %q: give a number of sandboxes per page from 1 to %d", s, maxPageLimit)
		}
		lq.limit = n
	}
	if tok := q.Get("nextToken"); tok != "" {
		k, err := decodePageKey(tok)
		if err != nil {
			return lq, err
		}
		lq.after = &k
	}
	return lq, nil
}

// parseStates reads state filters: comma-separated (the SDKs' form) or
// repeated. None means running and paused.
func parseStates(vals []string) ([]sandbox.State, error) {
	var out []sandbox.State
	for _, v := range vals {
		for _, s := range strings.Split(v, ",") {
			switch s {
			case "running":
				out = append(out, sandbox.StateRunning)
			case "paused":
				out = append(out, sandbox.StatePaused)
			default:
				return nil, errdefs.Invalid("state %q: use running or paused (comma-separated for both)", s)
			}
		}
	}
	if len(out) == 0 {
		out = []sandbox.State{sandbox.StateRunning, sandbox.StatePaused}
	}
	return out, nil
}

// listPage is one page of a list and the token of the next (empty when it
// is the last).
type listPage struct {
	items        []sandbox.Sandbox
	next         string
	totalRunning int
}

// page orders and cuts all (Backend.List's answer, already filtered by lq.filter) per lq. A
// page of a long list keeps only the limit first items as it scans
// (a bounded heap), so it costs O(n log limit), not a sort of all n.
func (lq listQuery) page(all []sandbox.Sandbox) listPage {
	var p listPage
	// before reports whether a comes before b in list order.
	before := func(a, b pageKey) bool { return a != b && a.less(b) != lq.desc }
	top := &pageHeap{before: before}
	more := false
	for _, sb := range all {
		if sb.State == sandbox.StateRunning {
			p.totalRunning++
		}
		k := keyOf(sb)
		if lq.after != nil && !before(*lq.after, k) {
			continue // on an earlier page
		}
		switch {
		case lq.limit == 0 || top.Len() < lq.limit:
			heap.Push(top, pageItem{k, sb})
		case before(k, top.items[0].key):
			top.items[0] = pageItem{k, sb}
			heap.Fix(top, 0)
			more = true
		default:
			more = true
		}
	}
	items := top.items
	slices.SortFunc(items, func(a, b pageItem) int {
		if before(a.key, b.key) {
			return -1
		}
		return 1
	})
	p.items = make([]sandbox.Sandbox, len(items))
	for i, it := range items {
		p.items[i] = it.sb
	}
	if more {
		p.next = items[len(items)-1].key.encode()
	}
	return p
}

type pageItem struct {
	key pageKey
	sb  sandbox.Sandbox
}

// pageHeap holds the first items of a page, the last of them (in list
// order) on top.
type pageHeap struct {
	items  []pageItem
	before func(a, b pageKey) bool
}

func (h *pageHeap) Len() int           { return len(h.items) }
func (h *pageHeap) Less(i, j int) bool { return h.before(h.items[j].key, h.items[i].key) }
func (h *pageHeap) Swap(i, j int)      { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *pageHeap) Push(x any)         { h.items = append(h.items, x.(pageItem)) }
func (h *pageHeap) Pop() any {
	x := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	return x
}

package api

import (
	"encoding/base64"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"agentenv/internal/errdefs"
	"agentenv/internal/sandbox"
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
	filter       sandbox.Filter
	template     string
	startedAfter time.Time
	desc         bool
	limit        int // 0: no paging (the v1 route)
	after        *pageKey
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
	lq.template = q.Get("template")
	if s := q.Get("startedAfter"); s != "" {
		if lq.startedAfter, err = time.Parse(time.RFC3339Nano, s); err != nil {
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

// page filters, orders and cuts all (Backend.List's answer) per lq.
func (lq listQuery) page(all []sandbox.Sandbox) listPage {
	var p listPage
	matched := make([]sandbox.Sandbox, 0, len(all))
	for _, sb := range all {
		if lq.template != "" && sb.Template != lq.template {
			continue
		}
		if !lq.startedAfter.IsZero() && sb.StartedAt.Before(lq.startedAfter) {
			continue
		}
		if sb.State == sandbox.StateRunning {
			p.totalRunning++
		}
		matched = append(matched, sb)
	}
	slices.SortFunc(matched, func(a, b sandbox.Sandbox) int {
		ka, kb := keyOf(a), keyOf(b)
		switch {
		case ka == kb:
			return 0
		case ka.less(kb) != lq.desc:
			return -1
		default:
			return 1
		}
	})
	if lq.after != nil {
		after := *lq.after
		i, _ := slices.BinarySearchFunc(matched, after, func(sb sandbox.Sandbox, k pageKey) int {
			// Position of the first item strictly after the key in list order.
			if keyOf(sb) == k || keyOf(sb).less(k) != lq.desc {
				return -1
			}
			return 1
		})
		matched = matched[i:]
	}
	if lq.limit > 0 && len(matched) > lq.limit {
		p.next = keyOf(matched[lq.limit-1]).encode()
		matched = matched[:lq.limit]
	}
	p.items = matched
	return p
}

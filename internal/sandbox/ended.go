package sandbox

import "time"

// ended remembers how the last sandboxes that were killed or timed out
// ended, so that a request for one says what happened ("it timed out at
// 12:04:05 UTC") instead of a bare "does not exist". It is bounded (the
// oldest are forgotten first) and not persisted: after a restart, or
// maxEnded kills later, the generic message returns. Guarded by
// the registry's lock.
type ended struct {
	byID  map[string]endedSandbox
	order []string // oldest first
}

type endedSandbox struct {
	at    time.Time
	cause string // EndKilled or EndTimeout
}

// maxEnded bounds the memory of ended sandboxes (about 100 bytes each).
const maxEnded = 10000

// add records that sandbox id ended at now for cause. Callers hold the registry's lock.
func (e *ended) add(id string, cause string, now time.Time) {
	if e.byID == nil {
		e.byID = map[string]endedSandbox{}
	}
	if _, ok := e.byID[id]; !ok {
		e.order = append(e.order, id)
	}
	e.byID[id] = endedSandbox{at: now.UTC(), cause: cause}
	for len(e.order) > maxEnded {
		delete(e.byID, e.order[0])
		e.order = e.order[1:]
	}
}

// how says how the sandbox id ended, and its cause, if it is remembered.
// Callers hold the registry's lock.
func (e *ended) how(id string) (string, string, bool) {
	r, ok := e.byID[id]
	if !ok {
		return "", "", false
	}
	at := r.at.Format("2006-01-02 15:04:05 MST")
	if r.cause != EndTimeout {
		return "it was killed at " + at, r.cause, true
	}
	return "it timed out at " + at + " (give it a longer timeout when you create it, or extend it while it runs)", r.cause, true
}

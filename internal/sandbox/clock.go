package sandbox

import "time"

// Clock is the time the sandboxes' timeouts run on: their deadlines, the
// timers that fire at them (a kill, or a pause with autoPause) and the
// checks made when they fire. Deps.Clock nil is the real clock; the
// unprivileged test tier passes a fake one so that timeouts happen at once.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f on its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc.
type Timer interface {
	// Stop prevents the call if it has not happened yet.
	Stop() bool
}

type realClock struct{}

func (realClock) Now() time.Time                            { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

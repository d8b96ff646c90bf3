package client

import (
	"errors"
	"strings"
)

// What ended a sandbox or a command, as Cause names it: the names of the
// Python SDK's exception.cause.
const (
	CauseOOM            = "oom"             // the command or the sandbox ran out of memory
	CauseLost           = "lost"            // the sandbox died on its own
	CauseSandboxTimeout = "sandbox_timeout" // the sandbox reached its timeout
	CauseKilled         = "killed"          // the sandbox was killed
	CauseCommandTimeout = "command_timeout" // the command reached its own timeout
)

// ErrOutOfMemory is the error of a command that envd killed because the
// sandbox ran out of memory (its exit code is 137); the sandbox lives on.
var ErrOutOfMemory = errors.New("the command was killed: the sandbox ran out of memory")

// Cause says what ended the sandbox or the command err is about (one of
// the Cause constants), or "" when err does not say: a command past its
// timeout or killed out of memory, or a request for a sandbox that ended,
// whose 404 carries end_cause.
func Cause(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrProcessTimeout):
		return CauseCommandTimeout
	case errors.Is(err, ErrOutOfMemory):
		return CauseOOM
	}
	var ae *Error
	if errors.As(err, &ae) {
		switch ae.EndCause {
		case "killed":
			return CauseKilled
		case "timeout":
			return CauseSandboxTimeout
		case "oom":
			return CauseOOM
		case "lost":
			return CauseLost
		}
	}
	return ""
}

// processError is a command's end with an error from envd: its message,
// and ErrOutOfMemory when envd says the command was killed for memory.
type processError struct {
	msg   string
	class error
}

func (e *processError) Error() string { return e.msg }
func (e *processError) Unwrap() error { return e.class }

// endError is the error of a command whose end event carries msg. envd's
// end event (E2B's protocol) has no code: its memory guard's kills say
// "out of memory" first, as the server's metrics read them.
func endError(msg string) error {
	e := &processError{msg: "process error: " + msg}
	if strings.HasPrefix(msg, "out of memory") {
		e.class = ErrOutOfMemory
	}
	return e
}

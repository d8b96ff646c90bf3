package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"connectrpc.com/connect"
)

// NotRunningError is an envd request that failed because its sandbox is
// not running: paused, or gone (killed, timed out, lost). The sandbox
// proxy answers such requests as E2B's does (502, "The sandbox was not
// found", what the official SDKs expect); this client asks the API why.
type NotRunningError struct {
	SandboxID string
	// State is the sandbox's state ("paused"...), or "" when it is gone.
	State string
	msg   string
	errs  []error
}

func (e *NotRunningError) Error() string { return e.msg }

// Unwrap gives the request's own error and, for a sandbox that is gone,
// the API's answer (an *Error with status 404).
func (e *NotRunningError) Unwrap() []error { return e.errs }

// statusError is a non-2xx answer of envd's HTTP routes (or of the proxy
// in front of them).
type statusError struct {
	Op      string
	Status  int
	Message string
}

func (e *statusError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("%s: HTTP %d", e.Op, e.Status)
	}
	return fmt.Sprintf("%s: HTTP %d: %s", e.Op, e.Status, e.Message)
}

// unreachable reports whether err is the proxy saying it cannot reach the
// sandbox (502, or 409 while it changes state).
func unreachable(err error) bool {
	var se *statusError
	if errors.As(err, &se) {
		return se.Status == http.StatusBadGateway || se.Status == http.StatusConflict
	}
	return connect.CodeOf(err) == connect.CodeUnavailable
}

// explain turns an envd request's failure to reach the sandbox into what
// the API says of it: paused (and how to resume it), or gone (and how).
// Other errors, and a sandbox that runs, keep err.
func (c *Client) explain(ctx context.Context, sb Sandbox, err error) error {
	if err == nil || !unreachable(err) {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	id := sb.SandboxID
	got, gerr := c.GetSandbox(ctx, id)
	var ae *Error
	switch {
	case errors.As(gerr, &ae) && ae.Status == http.StatusNotFound:
		return &NotRunningError{SandboxID: id, msg: ae.Message, errs: []error{ae, err}}
	case gerr != nil:
		return err
	case got.State == "paused":
		return &NotRunningError{SandboxID: id, State: got.State, errs: []error{err},
			msg: fmt.Sprintf("sandbox %s is paused: resume it with `agentenv sandbox resume %s`", id, id)}
	case got.State != "running":
		return &NotRunningError{SandboxID: id, State: got.State, errs: []error{err},
			msg: fmt.Sprintf("sandbox %s is %s, not running: retry in a moment", id, got.State)}
	}
	return err
}

package codeinterp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// keepaliveEvery is how often a cell that prints nothing writes a
// keepalive line, so that a client that went away is noticed (a write
// fails) and its cell interrupted.
const keepaliveEvery = 5 * time.Second

// interruptGrace is how long an interrupted cell has to stop before the
// kernel is restarted, so that the context stays usable.
const interruptGrace = 10 * time.Second

// errBusyCanceled is returned when the client left while waiting for a
// cell of the same context to end.
var errBusyCanceled = errors.New("the request ended while another cell of the context was running")

// acquire takes the busy token, waiting for the cell before to end.
func (k *kernel) acquire(ctx context.Context) error {
	select {
	case <-k.busy:
		return nil
	case <-ctx.Done():
		return errBusyCanceled
	}
}

func (k *kernel) release() { k.busy <- struct{}{} }

type executeRequest struct {
	Code            string         `json:"code"`
	Silent          bool           `json:"silent"`
	StoreHistory    bool           `json:"store_history"`
	UserExpressions map[string]any `json:"user_expressions"`
	AllowStdin      bool           `json:"allow_stdin"`
	StopOnError     bool           `json:"stop_on_error"`
}

// run executes code (the caller holds the busy token) and calls emit with
// each output line. When ctx ends or emit fails (the client went away),
// the cell is interrupted and its remaining output dropped; a cell that
// does not stop within interruptGrace has its kernel restarted. run
// returns once the kernel is idle again.
func (k *kernel) run(ctx context.Context, code string, silent bool, emit func(map[string]any) error) error {
	id := newID()
	sub := k.subscribe(id)
	defer k.unsubscribe(id)
	exited := k.exitedChan()
	// stop_on_error stays off: cells of a context are serialized here, so
	// the kernel never holds a queued cell of ours, and ipykernel's abort
	// window after an error would otherwise race the next cell and abort it.
	err := k.send(id, "execute_request", executeRequest{Code: code, Silent: silent, StoreHistory: !silent,
		UserExpressions: map[string]any{}, StopOnError: false})
	if err != nil {
		return fmt.Errorf("send the cell to the kernel: %w", err)
	}
	out := emit
	gone := ctx.Done()
	var grace <-chan time.Time
	drop := func() {
		if grace != nil {
			return
		}
		out = func(map[string]any) error { return nil }
		gone = nil
		grace = time.After(interruptGrace)
		k.interrupt()
	}
	put := func(line map[string]any) {
		if out(line) != nil {
			drop()
		}
	}
	tick := time.NewTicker(keepaliveEvery)
	defer tick.Stop()
	gotReply, gotIdle, errored := false, false, false
	for !gotReply || !gotIdle {
		select {
		case m := <-sub:
			switch m.Header.MsgType {
			case "status":
				var c struct {
					State string `json:"execution_state"`
				}
				json.Unmarshal(m.Content, &c)
				gotIdle = c.State == "idle"
			case "execute_input":
				var c struct {
					Count int `json:"execution_count"`
				}
				json.Unmarshal(m.Content, &c)
				if !silent {
					put(map[string]any{"type": lineCount, "execution_count": c.Count})
				}
			case "stream":
				var c struct{ Name, Text string }
				json.Unmarshal(m.Content, &c)
				if c.Name == lineStdout || c.Name == lineStderr {
					put(streamLine(c.Name, c.Text, m.Header.Date))
				}
			case "display_data", "execute_result":
				var c struct {
					Data map[string]json.RawMessage `json:"data"`
				}
				json.Unmarshal(m.Content, &c)
				put(resultLine(c.Data, m.Header.MsgType == "execute_result"))
			case "error":
				var c struct {
					Name      string   `json:"ename"`
					Value     string   `json:"evalue"`
					Traceback []string `json:"traceback"`
				}
				json.Unmarshal(m.Content, &c)
				if !errored {
					errored = true
					put(errorLine(c.Name, c.Value, c.Traceback))
				}
			case "execute_reply":
				gotReply = true
				var c struct {
					Status    string   `json:"status"`
					Name      string   `json:"ename"`
					Value     string   `json:"evalue"`
					Traceback []string `json:"traceback"`
				}
				json.Unmarshal(m.Content, &c)
				switch {
				case c.Status == "error" && !errored:
					errored = true
					put(errorLine(c.Name, c.Value, c.Traceback))
				case c.Status == "aborted":
					put(errorLine("ExecutionAborted", "Execution was aborted", nil))
				}
			}
		case <-tick.C:
			put(map[string]any{"type": lineKeepalive})
		case <-gone:
			drop()
		case <-grace:
			// The cell ignored the interrupt: a new kernel keeps the context usable.
			return k.restart(context.WithoutCancel(ctx))
		case <-exited:
			put(errorLine("KernelDied", "the kernel exited while running the cell (its variables are gone)", nil))
			return k.restart(context.WithoutCancel(ctx))
		}
	}
	return nil
}

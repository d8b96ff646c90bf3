package proxy

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	procpb "github.com/agentenv/agentenv/client/api/envd/processpb"
	"github.com/agentenv/agentenv/internal/metrics"
)

// keepMax is the largest Connect message an execWriter copies to look at:
// an end event (with its error message) or an end-of-stream message fits;
// bigger ones are output and pass untouched.
const keepMax = 4096

// execWriter passes a proxied process.Process/Start stream through and
// watches its Connect envelopes for the command's end: the end event (exit
// code, error) or an end-of-stream error (deadline_exceeded when the
// command's timeout killed it). It copies only messages up to keepMax
// bytes, and decodes only those that are an end.
type execWriter struct {
	http.ResponseWriter
	code   int
	format string // "proto" or "json", from the response's Content-Type; "" for other answers
	gzip   bool

	hdr  [5]byte
	hdrN int
	left uint32 // bytes of the current message still to come
	keep bool   // copying the current message into msg
	msg  []byte

	end      *procpb.ProcessEvent_EndEvent
	endError string // the end-of-stream error's code, "" for none
}

func (w *execWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
		ct := w.Header().Get("Content-Type")
		switch {
		case strings.HasPrefix(ct, "application/connect+proto"):
			w.format = "proto"
		case strings.HasPrefix(ct, "application/connect+json"):
			w.format = "json"
		}
		w.gzip = w.Header().Get("Connect-Content-Encoding") == "gzip"
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *execWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.code == http.StatusOK && w.format != "" {
		w.scan(p)
	}
	return w.ResponseWriter.Write(p)
}

func (w *execWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the writer below.
func (w *execWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// scan follows the envelopes (1 flag byte, 4 length bytes, the message)
// across writes.
func (w *execWriter) scan(p []byte) {
	for len(p) > 0 {
		if w.hdrN < len(w.hdr) {
			n := copy(w.hdr[w.hdrN:], p)
			w.hdrN += n
			p = p[n:]
			if w.hdrN < len(w.hdr) {
				return
			}
			w.left = binary.BigEndian.Uint32(w.hdr[1:])
			w.keep = w.left <= keepMax
			w.msg = w.msg[:0]
			if w.left == 0 {
				w.done()
			}
			continue
		}
		n := min(uint32(len(p)), w.left)
		if w.keep {
			w.msg = append(w.msg, p[:n]...)
		}
		w.left -= n
		p = p[n:]
		if w.left == 0 {
			w.done()
		}
	}
}

// done looks at a whole message that was kept, then waits for the next
// envelope.
func (w *execWriter) done() {
	flags, msg := w.hdr[0], w.msg
	w.hdrN = 0
	if !w.keep || w.end != nil {
		return
	}
	if flags&0x01 != 0 { // compressed
		if !w.gzip {
			return
		}
		r, err := gzip.NewReader(bytes.NewReader(msg))
		if err != nil {
			return
		}
		b, err := io.ReadAll(io.LimitReader(r, 4*keepMax))
		if err != nil {
			return
		}
		msg = b
	}
	if flags&0x02 != 0 { // end of stream: JSON whatever the codec
		var eos struct {
			Error *struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(msg, &eos) == nil && eos.Error != nil {
			w.endError = eos.Error.Code
		}
		return
	}
	if end := endEvent(w.format, msg); end != nil {
		w.end = end
	}
}

// endEvent decodes a StartResponse that carries an end event, or returns
// nil (output, start, keepalive) after a look at its first bytes.
func endEvent(format string, msg []byte) *procpb.ProcessEvent_EndEvent {
	var resp procpb.StartResponse
	switch format {
	case "proto":
		// Field 1 (event, a message), its length, then the event's
		// oneof field: 3 (end) is tag 0x1a.
		if len(msg) < 2 || msg[0] != 0x0a {
			return nil
		}
		_, n := binary.Uvarint(msg[1:])
		if n <= 0 || len(msg) <= 1+n || msg[1+n] != 0x1a {
			return nil
		}
		if proto.Unmarshal(msg, &resp) != nil {
			return nil
		}
	case "json":
		if !bytes.Contains(msg, []byte(`"end"`)) {
			return nil
		}
		if (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(msg, &resp) != nil {
			return nil
		}
	}
	return resp.GetEvent().GetEnd()
}

// result classifies the command (one of metrics.ExecResults), or returns
// "" when the answer says nothing about it: not a stream (the sandbox was
// not found, the proxy failed), or a stream the client left before the end
// (a background command). A stream cut without an end after the request's
// Connect-Timeout-Ms passed counts as a timeout: envd kills the command at
// that deadline, which the client may have acted on first.
func (w *execWriter) result(r *http.Request, elapsed time.Duration) string {
	if w.code != http.StatusOK || w.format == "" {
		return ""
	}
	if w.end != nil {
		return ClassifyEnd(w.end)
	}
	switch w.endError {
	case "":
	case "deadline_exceeded":
		return metrics.ExecTimeout
	default:
		return metrics.ExecError
	}
	if ms, err := strconv.ParseInt(r.Header.Get("Connect-Timeout-Ms"), 10, 64); err == nil && ms > 0 && elapsed >= time.Duration(ms)*time.Millisecond {
		return metrics.ExecTimeout
	}
	return ""
}

// ClassifyEnd names how a command ended from its end event: oom when envd
// killed it (or a process of its group) for memory, which it says in an
// error starting "out of memory", whatever the exit code (a shell that
// outlived its killed child keeps its own); ok for exit code 0; nonzero
// otherwise (a signal included).
func ClassifyEnd(end *procpb.ProcessEvent_EndEvent) string {
	switch {
	case strings.HasPrefix(end.GetError(), "out of memory"):
		return metrics.ExecOOM
	case end.GetExitCode() == 0 && end.Error == nil:
		return metrics.ExecOK
	}
	return metrics.ExecNonZero
}

package codeinterp

import (
	"encoding/json"
	"strings"
	"time"
)

// The lines of an /execute answer, one JSON object each, as E2B's SDKs
// parse them (their "type" field says which).
const (
	lineStdout     = "stdout"
	lineStderr     = "stderr"
	lineResult     = "result"
	lineError      = "error"
	lineCount      = "number_of_executions"
	lineKeepalive  = "keepalive"
	lineEndOfCells = "end_of_execution"
)

// mimeFields maps Jupyter's MIME types to the result fields the SDKs read.
// Other types go, under their MIME name, into the result's "extra".
var mimeFields = map[string]string{
	"text/plain":             "text",
	"text/html":              "html",
	"text/markdown":          "markdown",
	"image/svg+xml":          "svg",
	"image/png":              "png",
	"image/jpeg":             "jpeg",
	"application/pdf":        "pdf",
	"text/latex":             "latex",
	"application/json":       "json",
	"application/javascript": "javascript",
	"e2b/data":               "data",
	"e2b/chart":              "chart",
}

// resultLine turns a display_data or execute_result content's data (MIME
// type → value) into a result line. is_main_result is true for the cell's
// value (execute_result), false for display calls.
func resultLine(data map[string]json.RawMessage, main bool) map[string]any {
	out := map[string]any{"type": lineResult, "is_main_result": main}
	extra := map[string]any{}
	for mime, v := range data {
		field, ok := mimeFields[mime]
		if !ok {
			extra[mime] = v
			continue
		}
		if field == "text" {
			// A string's repr arrives quoted ('abc'); the SDKs show the text.
			var s string
			if json.Unmarshal(v, &s) == nil {
				if len(s) >= 2 && (s[0] == '\'' && s[len(s)-1] == '\'' || s[0] == '"' && s[len(s)-1] == '"') {
					s = s[1 : len(s)-1]
				}
				out[field] = s
				continue
			}
		}
		out[field] = v
	}
	if len(extra) > 0 {
		out["extra"] = extra
	}
	return out
}

// streamLine is a stdout or stderr line; the Python SDK needs a timestamp.
func streamLine(name, text string, date string) map[string]any {
	if date == "" {
		date = time.Now().UTC().Format(time.RFC3339Nano)
	}
	return map[string]any{"type": name, "text": text, "timestamp": date}
}

// errorLine is an error line with the traceback joined into one string.
func errorLine(name, value string, traceback []string) map[string]any {
	return map[string]any{"type": lineError, "name": name, "value": value, "traceback": strings.Join(traceback, "\n")}
}

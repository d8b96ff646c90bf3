package proxy

import (
	"encoding/binary"
	"net/http"
	"net/http/httptest"
	"testing"

	"google.golang.org/protobuf/proto"

	procpb "github.com/agentenv/agentenv/client/api/envd/processpb"
	"github.com/agentenv/agentenv/internal/metrics"
)

func envelope(flags byte, msg []byte) []byte {
	b := make([]byte, 5, 5+len(msg))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

func event(t *testing.T, ev *procpb.ProcessEvent) []byte {
	t.Helper()
	b, err := proto.Marshal(&procpb.StartResponse{Event: ev})
	if err != nil {
		t.Fatal(err)
	}
	return envelope(0, b)
}

func endOf(code int32, errMsg *string) *procpb.ProcessEvent {
	return &procpb.ProcessEvent{Event: &procpb.ProcessEvent_End{End: &procpb.ProcessEvent_EndEvent{ExitCode: code, Exited: true, Error: errMsg}}}
}

// TestExecWriterClassifies: the end of a proxied Start stream, written a
// byte at a time after big output, is classified by its end event or its
// end-of-stream error.
func TestExecWriterClassifies(t *testing.T) {
	oom := "out of memory: the sandbox used 500 MiB of its 512 MiB limit"
	big := make([]byte, 3*keepMax)
	data := &procpb.ProcessEvent{Event: &procpb.ProcessEvent_Data{Data: &procpb.ProcessEvent_DataEvent{Output: &procpb.ProcessEvent_DataEvent_Stdout{Stdout: big}}}}
	for _, tc := range []struct {
		name   string
		stream [][]byte
		want   string
	}{
		{"ok", [][]byte{event(t, endOf(0, nil)), envelope(2, []byte("{}"))}, metrics.ExecOK},
		{"nonzero", [][]byte{event(t, endOf(3, nil))}, metrics.ExecNonZero},
		{"oom", [][]byte{event(t, endOf(137, &oom))}, metrics.ExecOOM},
		{"shell outlived its killed child", [][]byte{event(t, endOf(3, &oom))}, metrics.ExecOOM},
		{"timeout", [][]byte{envelope(2, []byte(`{"error":{"code":"deadline_exceeded","message":"killed"}}`))}, metrics.ExecTimeout},
		{"error", [][]byte{envelope(2, []byte(`{"error":{"code":"invalid_argument"}}`))}, metrics.ExecError},
		{"client left", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			rec.Header().Set("Content-Type", "application/connect+proto")
			w := &execWriter{ResponseWriter: rec}
			var all []byte
			all = append(all, event(t, data)...)
			for _, m := range tc.stream {
				all = append(all, m...)
			}
			for i := range all {
				w.Write(all[i : i+1])
			}
			if got := w.result(httptest.NewRequest("POST", "/process.Process/Start", nil), 0); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestExecWriterNotAStream: an error answer (no sandbox) is not counted.
func TestExecWriterNotAStream(t *testing.T) {
	rec := httptest.NewRecorder()
	w := &execWriter{ResponseWriter: rec}
	w.WriteHeader(http.StatusNotFound)
	w.Write([]byte(`{"code":404}`))
	if got := w.result(httptest.NewRequest("POST", "/process.Process/Start", nil), 0); got != "" {
		t.Errorf("got %q, want none", got)
	}
}

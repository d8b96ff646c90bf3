package codeinterp

import (
	"encoding/json"
	"testing"
)

// A message the client signs decodes with the same key, with topic frames
// before the delimiter (as iopub sends them); another key's is refused.
func TestSignedMessageRoundTrip(t *testing.T) {
	s := signer{key: []byte("k1")}
	frames, err := s.encode("sess", "m1", "execute_request", map[string]string{"code": "1"})
	if err != nil {
		t.Fatal(err)
	}
	withTopic := append([][]byte{[]byte("kernel.x.status")}, frames...)
	m, err := s.decode(withTopic)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if m.Header.MsgID != "m1" || m.Header.MsgType != "execute_request" || m.Header.Session != "sess" {
		t.Errorf("got header %+v, want msg_id m1, execute_request, session sess", m.Header)
	}
	if _, err := (signer{key: []byte("k2")}).decode(frames); err == nil {
		t.Error("decode with another key: got nil error, want a bad signature")
	}
	if _, err := s.decode(frames[:4]); err == nil {
		t.Error("decode of a truncated message: got nil error")
	}
}

// Jupyter's MIME bundle maps onto the fields E2B's SDKs read; a quoted
// string repr loses its quotes; unknown types go to extra.
func TestResultLine(t *testing.T) {
	data := map[string]json.RawMessage{
		"text/plain":       json.RawMessage(`"'abc'"`),
		"text/html":        json.RawMessage(`"<b>x</b>"`),
		"image/png":        json.RawMessage(`"iVBOR"`),
		"application/json": json.RawMessage(`{"a":1}`),
		"e2b/data":         json.RawMessage(`{"a":[1,2]}`),
		"text/x-custom":    json.RawMessage(`"c"`),
	}
	got := resultLine(data, true)
	b, _ := json.Marshal(got)
	var back map[string]any
	json.Unmarshal(b, &back)
	want := map[string]any{"type": "result", "is_main_result": true, "text": "abc", "html": "<b>x</b>", "png": "iVBOR",
		"json": map[string]any{"a": 1.0}, "data": map[string]any{"a": []any{1.0, 2.0}}, "extra": map[string]any{"text/x-custom": "c"}}
	wb, _ := json.Marshal(want)
	if string(b) != string(wb) {
		t.Errorf("got %s, want %s", b, wb)
	}
}

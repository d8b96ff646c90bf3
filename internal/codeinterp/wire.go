package codeinterp

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// delimiter separates a message's routing frames from its body in
// Jupyter's wire protocol.
var delimiter = []byte("<IDS|MSG>")

// protocolVersion is the Jupyter messaging version this client speaks.
const protocolVersion = "5.3"

// header is a Jupyter message header.
type header struct {
	MsgID    string `json:"msg_id"`
	Session  string `json:"session"`
	Username string `json:"username"`
	Date     string `json:"date"`
	MsgType  string `json:"msg_type"`
	Version  string `json:"version"`
}

// message is one Jupyter message: a header, its parent's header (what it
// answers), metadata and a content that depends on the type.
type message struct {
	Header   header
	Parent   header
	Metadata map[string]any
	Content  json.RawMessage
}

// signer signs and checks messages with the connection's HMAC key.
type signer struct {
	key []byte
}

func (s signer) sign(parts ...[]byte) []byte {
	if len(s.key) == 0 {
		return nil
	}
	m := hmac.New(sha256.New, s.key)
	for _, p := range parts {
		m.Write(p)
	}
	out := make([]byte, hex.EncodedLen(m.Size()))
	hex.Encode(out, m.Sum(nil))
	return out
}

// encode makes the frames of a request of type msgType with content.
func (s signer) encode(session, msgID, msgType string, content any) ([][]byte, error) {
	h, err := json.Marshal(header{MsgID: msgID, Session: session, Username: "codeinterp",
		Date: time.Now().UTC().Format(time.RFC3339Nano), MsgType: msgType, Version: protocolVersion})
	if err != nil {
		return nil, err
	}
	c, err := json.Marshal(content)
	if err != nil {
		return nil, err
	}
	parent, meta := []byte("{}"), []byte("{}")
	return [][]byte{delimiter, s.sign(h, parent, meta, c), h, parent, meta, c}, nil
}

// decode parses the frames of a message from the kernel (routing frames
// or a PUB topic first) and checks its signature.
func (s signer) decode(frames [][]byte) (*message, error) {
	i := 0
	for i < len(frames) && !bytes.Equal(frames[i], delimiter) {
		i++
	}
	if len(frames)-i < 6 {
		return nil, fmt.Errorf("jupyter message: %d frames after the delimiter, want at least 6", len(frames)-i)
	}
	f := frames[i+1:]
	if want := s.sign(f[1], f[2], f[3], f[4]); !hmac.Equal(want, f[0]) {
		return nil, errors.New("jupyter message: bad signature")
	}
	m := &message{Content: json.RawMessage(f[4])}
	if err := json.Unmarshal(f[1], &m.Header); err != nil {
		return nil, fmt.Errorf("jupyter message header: %w", err)
	}
	// An empty parent is {} and decodes to the zero header.
	if err := json.Unmarshal(f[2], &m.Parent); err != nil {
		return nil, fmt.Errorf("jupyter message parent header: %w", err)
	}
	if err := json.Unmarshal(f[3], &m.Metadata); err != nil {
		return nil, fmt.Errorf("jupyter message metadata: %w", err)
	}
	return m, nil
}

// newID returns a random identifier of 32 hex digits.
func newID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

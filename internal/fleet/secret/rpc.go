package secret

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// AuthHeader carries a node RPC's proof of the cluster secret:
//
//	v2.<unix time>.<nonce>.<body>.<MAC>
//
// The MAC (HMAC-SHA-256, key derived from the cluster secret) covers the
// time, a random nonce, the method, the host, the escaped path, the raw
// query, the headers that choose what a node does (coveredHeaders) and
// the body. A node accepts a header for Skew either side of its clock
// and only once: it remembers the nonces it has accepted until their
// time falls out of the window (Verifier). The secret itself never
// travels, so a captured request gives no one the key to etcd's records,
// and replayed or altered it is refused.
//
// <body> says how the body is covered:
//   - "e": there is none; a request that has one is refused.
//   - "s<hex SHA-256>": a body of known length up to MaxHashedBody (a
//     unary RPC, a small file write forwarded): the sender reads it
//     first, the node reads it whole and checks the hash before its
//     handler sees a byte, so a changed body has no effect at all.
//   - "c<length>": a larger body or one of unknown length (uploads,
//     streamed sandbox traffic; length -1 when unknown) travels framed in chunks,
//     each with a MAC chained from the header's (chunkWriter): the node
//     hands its handler only the bytes of chunks that verified, and the
//     body ends with an error, never a clean end, if a chunk is altered,
//     dropped, or the end mark is missing. A stream cannot be hashed
//     before it is sent without holding all of it, and a hash checked at
//     the end would come after the handler acted on the bytes (a
//     sandbox's stdin), so each chunk is checked before it is passed on.
const AuthHeader = "X-Agentenv-Fleet-Auth"

// Skew is how far a caller's clock may be from the node's.
const Skew = 5 * time.Minute

// MaxHashedBody bounds the bodies covered by one hash (read whole by
// the sender and the node: a unary RPC is at most 1 MiB); larger ones
// stream in chunks.
const MaxHashedBody = 2 << 20

// maxChunk bounds one chunk of a streamed body.
const maxChunk = 64 << 10

// coveredHeaders are the request headers that change what a node does
// with a request: the sandbox and port a request is routed to, a build's
// request, the byte range and encoding of an export.
var coveredHeaders = []string{"E2b-Sandbox-Id", "E2b-Sandbox-Port", "X-Agentenv-Build", "X-Agentenv-Upload", "Range", "X-Agentenv-Sparse"}

// Auth makes AuthHeader values.
type Auth struct{ key []byte }

func NewAuth(secret string) Auth { return Auth{key: deriveKey(secret, rpcKeyInfo)} }

// Sign sets r's AuthHeader. A body of known length up to MaxHashedBody
// is read and hashed; any other body is replaced by its framed form,
// sent with an unknown length (the node restores the declared one).
// Sign fails only if a body to hash cannot be read.
func (a Auth) Sign(r *http.Request) error {
	return a.signAt(r, time.Now())
}

func (a Auth) signAt(r *http.Request, now time.Time) error {
	var nonce [16]byte
	rand.Read(nonce[:])
	ts := strconv.FormatInt(now.Unix(), 10)
	n := base64.RawURLEncoding.EncodeToString(nonce[:])
	var body string
	var stream io.ReadCloser
	switch {
	case r.Body == nil || r.Body == http.NoBody:
		body = "e"
	case r.ContentLength > 0 && r.ContentLength <= MaxHashedBody:
		b, err := io.ReadAll(io.LimitReader(r.Body, r.ContentLength+1))
		r.Body.Close()
		if err != nil {
			return fmt.Errorf("signing a fleet request: reading its body: %w", err)
		}
		if int64(len(b)) != r.ContentLength {
			return fmt.Errorf("signing a fleet request: its body has %d bytes, its Content-Length says %d", len(b), r.ContentLength)
		}
		sum := sha256.Sum256(b)
		body = "s" + hex.EncodeToString(sum[:])
		r.Body = io.NopCloser(bytes.NewReader(b))
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	default:
		declared := r.ContentLength
		if declared <= 0 {
			declared = -1 // a client request's 0 with a body means unknown
		}
		body = "c" + strconv.FormatInt(declared, 10)
		stream = r.Body
	}
	mac := a.mac(r, ts, n, body)
	r.Header.Set(AuthHeader, "v2."+ts+"."+n+"."+body+"."+base64.RawURLEncoding.EncodeToString(mac))
	if stream != nil {
		r.Body = &chunkWriter{src: stream, h: hmac.New(sha256.New, a.key), prev: mac}
		r.ContentLength, r.GetBody = -1, nil
		r.TransferEncoding = nil
	}
	return nil
}

// mac is the MAC of a request's header: each field length-prefixed, so
// no field's bytes can pass for another's.
func (a Auth) mac(r *http.Request, ts, nonce, body string) []byte {
	h := hmac.New(sha256.New, a.key)
	field := func(s string) {
		var l [4]byte
		binary.BigEndian.PutUint32(l[:], uint32(len(s)))
		h.Write(l[:])
		h.Write([]byte(s))
	}
	host := r.Host
	if host == "" && r.URL != nil {
		host = r.URL.Host
	}
	field("agentenv fleet rpc v2")
	field(ts)
	field(nonce)
	field(r.Method)
	field(host)
	field(r.URL.EscapedPath())
	field(r.URL.RawQuery)
	for _, k := range coveredHeaders {
		field(strings.Join(r.Header.Values(k), "\x00"))
	}
	field(body)
	return h.Sum(nil)
}

// chunkMAC is the MAC of one chunk of a streamed body: chained from the
// one before it (the header's for the first), so chunks can be neither
// altered, reordered, dropped nor added. A chunk of length 0 ends the
// body.
func chunkMAC(h hash.Hash, prev, data []byte) []byte {
	h.Reset()
	var l [4]byte
	binary.BigEndian.PutUint32(l[:], uint32(len(data)))
	h.Write([]byte("chunk"))
	h.Write(prev)
	h.Write(l[:])
	h.Write(data)
	return h.Sum(nil)
}

// chunkWriter frames a streamed body: [4-byte length][MAC][data] per
// read of the source (so a stream's pieces go out as they come), then an
// empty chunk at its end.
type chunkWriter struct {
	src  io.ReadCloser
	h    hash.Hash
	prev []byte
	buf  []byte
	out  []byte // framed bytes not yet read
	done bool
	err  error
}

func (c *chunkWriter) Read(p []byte) (int, error) {
	for len(c.out) == 0 {
		if c.err != nil {
			return 0, c.err
		}
		if c.done {
			return 0, io.EOF
		}
		if c.buf == nil {
			c.buf = make([]byte, maxChunk)
		}
		k, err := c.src.Read(c.buf)
		if k > 0 {
			c.frame(c.buf[:k])
		}
		switch {
		case errors.Is(err, io.EOF):
			c.frame(nil)
			c.done = true
		case err != nil:
			c.err = err
		}
	}
	k := copy(p, c.out)
	c.out = c.out[k:]
	return k, nil
}

func (c *chunkWriter) frame(data []byte) {
	c.prev = chunkMAC(c.h, c.prev, data)
	c.out = binary.BigEndian.AppendUint32(c.out, uint32(len(data)))
	c.out = append(c.out, c.prev...)
	c.out = append(c.out, data...)
}

func (c *chunkWriter) Close() error { return c.src.Close() }

// chunkReader checks a framed body chunk by chunk and passes on only
// bytes that verified; a bad chunk, a missing end mark or a length other
// than the declared one end it with an error.
type chunkReader struct {
	src      io.ReadCloser
	h        hash.Hash
	prev     []byte
	declared int64 // -1: unknown
	seen     int64
	left     []byte
	buf      []byte
	done     bool
	err      error
}

func (c *chunkReader) Read(p []byte) (int, error) {
	for len(c.left) == 0 {
		if c.err != nil {
			return 0, c.err
		}
		if c.done {
			return 0, io.EOF
		}
		c.err = c.next()
	}
	k := copy(p, c.left)
	c.left = c.left[k:]
	return k, nil
}

func (c *chunkReader) next() error {
	var hdr [4 + sha256.Size]byte
	if _, err := io.ReadFull(c.src, hdr[:]); err != nil {
		return c.cut(err)
	}
	n := binary.BigEndian.Uint32(hdr[:4])
	if n > maxChunk {
		return fmt.Errorf("fleet request body: a chunk of %d bytes, more than the %d a sender makes: refused: %w", n, maxChunk, errdefs.ErrUnauthenticated)
	}
	if c.buf == nil {
		c.buf = make([]byte, maxChunk)
	}
	data := c.buf[:n]
	if _, err := io.ReadFull(c.src, data); err != nil {
		return c.cut(err)
	}
	want := chunkMAC(c.h, c.prev, data)
	if !hmac.Equal(want, hdr[4:]) {
		return fmt.Errorf("fleet request body: chunk after byte %d does not match its MAC (changed on the way, or not sent with this header): refused: %w", c.seen, errdefs.ErrUnauthenticated)
	}
	c.prev = want
	c.seen += int64(n)
	if c.declared >= 0 && c.seen > c.declared {
		return fmt.Errorf("fleet request body: more than the %d bytes its header declares: refused: %w", c.declared, errdefs.ErrUnauthenticated)
	}
	if n == 0 {
		if c.declared >= 0 && c.seen != c.declared {
			return fmt.Errorf("fleet request body: %d bytes, its header declares %d: refused: %w", c.seen, c.declared, errdefs.ErrUnauthenticated)
		}
		c.done = true
		return nil
	}
	c.left = data
	return nil
}

func (c *chunkReader) cut(err error) error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("fleet request body ended before its end mark (cut off on the way?) after %d bytes: %w", c.seen, err)
}

func (c *chunkReader) Close() error { return c.src.Close() }

// MaxNonces bounds the nonces a Verifier remembers: about 3,500 requests
// a second sustained over Skew. Beyond it requests are refused (503)
// until old ones expire, rather than memory growing without bound.
const MaxNonces = 1 << 20

// Verifier checks AuthHeader values: the MAC, the time, that the nonce
// was not seen before, and the body. Safe for concurrent use.
type Verifier struct {
	auth Auth
	now  func() time.Time
	max  int

	mu sync.Mutex
	// seen holds the accepted nonces by their header's time (the MAC
	// binds nonce and time, so a replay carries the same time): a whole
	// second is dropped once it is out of the window. Keyed by the
	// nonce's first 8 bytes (random; a collision refuses one request).
	seen  map[int64]map[uint64]struct{}
	n     int
	swept int64
}

// NewVerifier returns the verifier of a fleet with this cluster secret.
func NewVerifier(secret string) *Verifier {
	return &Verifier{auth: NewAuth(secret), now: time.Now, max: MaxNonces, seen: map[int64]map[uint64]struct{}{}}
}

func unauthenticated(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), errdefs.ErrUnauthenticated)
}

// Verify checks r's AuthHeader and replaces r's body by what verifies
// it: a hashed body is read whole and checked before Verify returns, a
// streamed one is checked chunk by chunk as it is read. Errors are
// ErrUnauthenticated, or ErrUnavailable when the nonce cache is full.
func (v *Verifier) Verify(r *http.Request) error {
	parts := strings.Split(r.Header.Get(AuthHeader), ".")
	if len(parts) != 5 || parts[0] != "v2" {
		return unauthenticated("no valid %s header", AuthHeader)
	}
	ts, nonceS, body, macS := parts[1], parts[2], parts[3], parts[4]
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return unauthenticated("malformed time in %s", AuthHeader)
	}
	now := v.now().Unix()
	skew := int64(Skew / time.Second)
	if sec < now-skew || sec > now+skew {
		return unauthenticated("the request was made at %s, more than %s from this node's clock (%s): a replay, or clocks that disagree",
			time.Unix(sec, 0).UTC().Format(time.RFC3339), Skew, time.Unix(now, 0).UTC().Format(time.RFC3339))
	}
	nonce, err := base64.RawURLEncoding.DecodeString(nonceS)
	if err != nil || len(nonce) != 16 {
		return unauthenticated("malformed nonce in %s", AuthHeader)
	}
	got, err := base64.RawURLEncoding.DecodeString(macS)
	want := v.auth.mac(r, ts, nonceS, body)
	if err != nil || !hmac.Equal(got, want) {
		return unauthenticated("the MAC does not match the request (another cluster secret, or a request changed on the way)")
	}
	if err := v.remember(sec, binary.BigEndian.Uint64(nonce), now); err != nil {
		return err
	}
	return v.body(r, body, want)
}

// remember records a nonce accepted at time sec; a nonce seen before is
// a replay.
func (v *Verifier) remember(sec int64, nonce uint64, now int64) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if now != v.swept {
		v.swept = now
		for s, m := range v.seen {
			if s < now-int64(Skew/time.Second) {
				v.n -= len(m)
				delete(v.seen, s)
			}
		}
	}
	m := v.seen[sec]
	if _, ok := m[nonce]; ok {
		return unauthenticated("the request was seen before (a replay of a captured request)")
	}
	if v.n >= v.max {
		return errdefs.Unavailable("this node accepted %d fleet requests within %s and remembers no more of them: retry in a moment", v.n, Skew)
	}
	if m == nil {
		m = map[uint64]struct{}{}
		v.seen[sec] = m
	}
	m[nonce] = struct{}{}
	v.n++
	return nil
}

// body checks r's body against the header's <body>.
func (v *Verifier) body(r *http.Request, body string, mac []byte) error {
	hasBody := r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0
	switch {
	case body == "e":
		if hasBody {
			return unauthenticated("the request has a body its MAC does not cover")
		}
		return nil
	case strings.HasPrefix(body, "s"):
		want, err := hex.DecodeString(body[1:])
		if err != nil || len(want) != sha256.Size {
			return unauthenticated("malformed body hash in %s", AuthHeader)
		}
		if r.ContentLength > MaxHashedBody {
			return unauthenticated("a %d-byte body under a hash: more than the %d a sender hashes", r.ContentLength, MaxHashedBody)
		}
		var b []byte
		if hasBody {
			if b, err = io.ReadAll(io.LimitReader(r.Body, MaxHashedBody+1)); err != nil {
				return fmt.Errorf("reading the request body: %w", err)
			}
		}
		if sum := sha256.Sum256(b); !hmac.Equal(sum[:], want) {
			return unauthenticated("the body does not match the hash its MAC covers (changed on the way?)")
		}
		r.Body, r.ContentLength, r.TransferEncoding = io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
		return nil
	case strings.HasPrefix(body, "c"):
		declared, err := strconv.ParseInt(body[1:], 10, 64)
		if err != nil || declared < -1 {
			return unauthenticated("malformed body length in %s", AuthHeader)
		}
		src := r.Body
		if src == nil {
			src = http.NoBody
		}
		r.Body = &chunkReader{src: src, h: hmac.New(sha256.New, v.auth.key), prev: mac, declared: declared}
		r.ContentLength, r.TransferEncoding = declared, nil
		if declared == 0 {
			r.ContentLength = -1 // still framed: 0 would tell handlers there is nothing to read
		}
		return nil
	}
	return unauthenticated("malformed body in %s", AuthHeader)
}

// Package envdauth is envd's access rule, which envd and the host's
// sandbox proxy both apply: a request to envd carries its access token, or
// is a /files URL signed with it as E2B's SDKs sign them. It must not
// hold anything else.
package envdauth

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"time"
)

// Refusal says why a request to a route that needs envd's access token
// may not pass, "" when it may: the token in X-Access-Token, or a signed
// /files URL. The sandbox proxy asks it too, before traffic wakes a
// paused sandbox.
func Refusal(r *http.Request, token string) string {
	if token == "" {
		return ""
	}
	got := r.Header.Get("X-Access-Token")
	if subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1 {
		return ""
	}
	if r.URL.Path != "/files" {
		return "unauthorized access, please provide a valid access token or method signing if supported"
	}
	if got != "" {
		return "access token present in header but does not match"
	}
	return signatureRefusal(r, token)
}

// signatureRefusal checks the signed /files URLs the E2B SDK makes
// (uploadUrl/downloadUrl): signature=v1_<base64 sha256 of
// "path:operation:user:token[:expiration]">, optionally expiring.
func signatureRefusal(r *http.Request, token string) string {
	q := r.URL.Query()
	if !q.Has("signature") {
		return "missing signature query parameter"
	}
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	exp := q.Get("signature_expiration")
	var expires int64
	if q.Has("signature_expiration") {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil {
			return "invalid signature"
		}
		expires = n
	}
	want := FileSignature(q.Get("path"), op, q.Get("username"), token, exp)
	if subtle.ConstantTimeCompare([]byte(q.Get("signature")), []byte(want)) != 1 {
		return "invalid signature"
	}
	if q.Has("signature_expiration") && expires < time.Now().Unix() {
		return "signature is already expired"
	}
	return ""
}

// FileSignature is the signature of a /files URL as E2B's SDKs make it:
// "v1_" + unpadded base64 of SHA-256 over "path:operation:user:token",
// with ":expiration" (Unix seconds) when the URL expires. operation is
// "read" (GET) or "write" (POST).
func FileSignature(path, operation, user, token, expiration string) string {
	msg := path + ":" + operation + ":" + user + ":" + token
	if expiration != "" {
		msg += ":" + expiration
	}
	sum := sha256.Sum256([]byte(msg))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

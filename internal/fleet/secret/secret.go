// Package secret holds what is derived from a fleet's cluster secret: the
// sealing of etcd records and the proof each node RPC carries. The secret
// itself never leaves the process.
package secret

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Keys derived from the cluster secret. The secret itself never leaves
// the process: etcd holds records sealed with one key, node RPCs carry a
// MAC made with another.
const (
	recordKeyInfo = "agentenv fleet: etcd records v1"
	rpcKeyInfo    = "agentenv fleet: node rpc v1"
)

func deriveKey(secret, info string) []byte {
	k, err := hkdf.Key(sha256.New, []byte(secret), []byte("agentenv"), info, 32)
	if err != nil {
		panic(err) // only for lengths HKDF cannot give; 32 it always can
	}
	return k
}

// SealPrefix marks a sealed record (and its format's version).
const SealPrefix = "ae1:"

// ErrUnsealed is why a record is ignored: it was not sealed with this
// fleet's secret (written by someone who reached etcd without it, by a
// fleet with another secret, or by an older agentenv).
var ErrUnsealed = errors.New("not sealed with this fleet's cluster secret")

// Sealer seals the fleet's etcd records: AES-256-GCM with a key derived
// from the cluster secret, the record's etcd key as associated data. A
// reader of etcd learns nothing of a record (no access token, traffic
// token or environment variable is stored in clear), and a writer without
// the secret can neither forge a record nor move one to another key;
// records are verified on every read, and one that does not open is
// ignored. What sealing cannot stop is deleting keys or putting back an
// older sealed value of the same key: etcd's own authentication (client
// certificates) is what keeps those out.
type Sealer struct {
	aead cipher.AEAD
}

// NewSealer returns the sealer of a fleet with this cluster secret.
func NewSealer(secret string) *Sealer {
	block, err := aes.NewCipher(deriveKey(secret, recordKeyInfo))
	if err != nil {
		panic(err) // a 32-byte key is always valid
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return &Sealer{aead: aead}
}

// seal encodes v as JSON and seals it for key.
func (s *Sealer) Seal(key string, v any) (string, error) {
	plain, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	return s.SealBytes(key, plain), nil
}

func (s *Sealer) SealBytes(key string, plain []byte) string {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(plain)+s.aead.Overhead())
	rand.Read(nonce)
	return SealPrefix + base64.RawStdEncoding.EncodeToString(s.aead.Seal(nonce, nonce, plain, []byte(key)))
}

// open verifies a sealed value of key and decodes it into v.
func (s *Sealer) Open(key string, val []byte, v any) error {
	plain, err := s.OpenBytes(key, val)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(plain, v); err != nil {
		return fmt.Errorf("record %s: %w", key, err)
	}
	return nil
}

func (s *Sealer) OpenBytes(key string, val []byte) ([]byte, error) {
	rest, ok := strings.CutPrefix(string(val), SealPrefix)
	if !ok {
		return nil, fmt.Errorf("record %s: %w", key, ErrUnsealed)
	}
	raw, err := base64.RawStdEncoding.DecodeString(rest)
	if err != nil || len(raw) < s.aead.NonceSize() {
		return nil, fmt.Errorf("record %s: %w", key, ErrUnsealed)
	}
	ns := s.aead.NonceSize()
	plain, err := s.aead.Open(nil, raw[:ns], raw[ns:], []byte(key))
	if err != nil {
		return nil, fmt.Errorf("record %s: %w", key, ErrUnsealed)
	}
	return plain, nil
}

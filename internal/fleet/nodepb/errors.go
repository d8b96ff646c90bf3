package nodepb

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/sandbox"
)

// Errors cross the node service as Connect codes: each errdefs class has
// one code, and a class that shares its code (too large, insufficient
// storage) or a reason the caller acts on (a lost sandbox) travels in an
// ErrorDetail. Nothing on either side reads an error's text to decide.

var codes = []struct {
	class error
	code  connect.Code
	// shared: another class has the same code; the detail names it.
	shared bool
}{
	{errdefs.ErrNotFound, connect.CodeNotFound, false},
	{errdefs.ErrInvalid, connect.CodeInvalidArgument, false},
	{errdefs.ErrConflict, connect.CodeFailedPrecondition, false},
	{errdefs.ErrUnauthenticated, connect.CodeUnauthenticated, false},
	{errdefs.ErrPermissionDenied, connect.CodePermissionDenied, false},
	{errdefs.ErrTooLarge, connect.CodeResourceExhausted, true},
	{errdefs.ErrInsufficientStorage, connect.CodeResourceExhausted, true},
	{errdefs.ErrResourceExhausted, connect.CodeResourceExhausted, false},
	{errdefs.ErrUnavailable, connect.CodeUnavailable, false},
}

// Code is the Connect code of err's class, with the detail that must
// travel with it (nil when the code says all).
func Code(err error) (connect.Code, *ErrorDetail) {
	var detail *ErrorDetail
	if errors.Is(err, sandbox.ErrLost) {
		detail = &ErrorDetail{Lost: true}
	}
	if cause := sandbox.EndCause(err); cause != "" {
		if detail == nil {
			detail = &ErrorDetail{}
		}
		detail.EndCause = cause
	}
	for _, c := range codes {
		if errors.Is(err, c.class) {
			if c.shared {
				_, name := errdefs.HTTPStatus(err)
				if detail == nil {
					detail = &ErrorDetail{}
				}
				detail.Class = name
			}
			return c.code, detail
		}
	}
	return connect.CodeUnknown, detail
}

// Wire is err as a Connect error: its class's code and its message.
func Wire(err error) *connect.Error {
	if err == nil {
		return nil
	}
	code, detail := Code(err)
	ce := connect.NewError(code, errors.New(err.Error()))
	if detail != nil {
		if d, derr := connect.NewErrorDetail(detail); derr == nil {
			ce.AddDetail(d)
		}
	}
	return ce
}

// Unwire is the error a Connect error from a node stands for: its
// message, wrapping the class its code (and detail) name.
func Unwire(err error) error {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return err
	}
	var detail *ErrorDetail
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if ed, ok := v.(*ErrorDetail); ok {
				detail = ed
			}
		}
	}
	return decode(ce.Code(), ce.Message(), detail)
}

func decode(code connect.Code, msg string, detail *ErrorDetail) error {
	var class error
	if detail.GetClass() != "" {
		class = errdefs.FromCode(detail.GetClass(), msg)
	}
	if class == nil || !errdefs.Classified(class) {
		class = nil
		for _, c := range codes {
			if c.code == code && !c.shared {
				class = errdefs.Received(msg, c.class)
				break
			}
		}
	}
	if class == nil {
		class = errors.New(msg)
	}
	if detail.GetLost() {
		class = errdefs.Received(msg, errors.Join(sandbox.ErrLost, class))
	}
	return sandbox.WithEndCause(class, detail.GetEndCause())
}

// ChildErr is a fork child's error as the answer carries it.
func ChildErr(err error) *ChildError {
	if err == nil {
		return nil
	}
	code, detail := Code(err)
	return &ChildError{Code: code.String(), Message: err.Error(), Detail: detail}
}

// FromChildErr is the error a fork child's answer carries (nil for none).
func FromChildErr(p *ChildError) error {
	if p == nil {
		return nil
	}
	var code connect.Code
	if code.UnmarshalText([]byte(p.GetCode())) != nil {
		code = connect.CodeUnknown
	}
	return decode(code, p.GetMessage(), p.GetDetail())
}

// httpError is an error in the body of a plain HTTP answer of a node (its
// build stream and its exports): the same codes as the service's.
type httpError struct {
	Code    string       `json:"code"`
	Message string       `json:"message"`
	Detail  *ErrorDetail `json:"detail,omitempty"`
}

// WriteHTTPError answers a plain HTTP request of a node with err.
func WriteHTTPError(w http.ResponseWriter, err error) {
	status, _ := errdefs.HTTPStatus(err)
	code, detail := Code(err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(httpError{Code: code.String(), Message: err.Error(), Detail: detail})
}

// ReadHTTPError is the error a node's plain HTTP answer carries.
func ReadHTTPError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var he httpError
	var code connect.Code
	if json.Unmarshal(b, &he) != nil || he.Message == "" || code.UnmarshalText([]byte(he.Code)) != nil {
		return errdefs.Unavailable("node answered HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}
	return decode(code, he.Message, he.Detail)
}

// EncodeError is err as a line of a node's stream (a build's last event).
func EncodeError(err error) json.RawMessage {
	code, detail := Code(err)
	b, _ := json.Marshal(httpError{Code: code.String(), Message: err.Error(), Detail: detail})
	return b
}

// DecodeError is the error a stream line made by EncodeError carries.
func DecodeError(raw json.RawMessage) error {
	var he httpError
	var code connect.Code
	if json.Unmarshal(raw, &he) != nil || code.UnmarshalText([]byte(he.Code)) != nil {
		return errdefs.Unavailable("undecodable error from a node: %s", raw)
	}
	return decode(code, he.Message, he.Detail)
}

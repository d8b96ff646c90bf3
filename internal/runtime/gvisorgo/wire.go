package gvisorgo

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
)

// The protocol between the server and a worker, over a unix stream
// socketpair: the server sends a hello (settings) and then one request at a
// time; the worker answers each with one response. A frame is a 4-byte
// big-endian length and that much JSON; a response that names a sandbox
// process carries a pidfd of it (SCM_RIGHTS) with the frame's first byte.

// Worker operations.
const (
	opCreate  = "create"  // prepare + start (runtime.Runtime.Create)
	opPrepare = "prepare" // container.New only (runtime.Preparer)
	opRestore = "restore" // into the prepared container, or a new one
)

// request is one operation for a worker.
type request struct {
	Op   string       `json:"op"`
	Spec runtime.Spec `json:"spec"`
	// Image is the checkpoint directory of a restore.
	Image string `json:"image,omitempty"`
}

// response answers a request. Pid is the sandbox process (its pidfd rides
// along) when the operation succeeded.
type response struct {
	Pid int `json:"pid,omitempty"`
	// Err is the error's message; Class its errdefs class (the code of
	// errdefs.HTTPStatus), so that errors.Is works across the socket.
	Err   string `json:"err,omitempty"`
	Class string `json:"class,omitempty"`
	// Retire says the worker exits after this answer: it must not be
	// handed another request.
	Retire bool `json:"retire,omitempty"`
}

// hello is the worker's answer to the settings.
type hello struct {
	Pid int `json:"pid"`
}

// maxFrame bounds a frame: requests carry a spec (environment included),
// nothing larger.
const maxFrame = 16 << 20

// writeFrame sends v, with f (if not nil) attached.
func writeFrame(c *net.UnixConn, v any, f *os.File) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	buf := make([]byte, 4+len(b))
	binary.BigEndian.PutUint32(buf, uint32(len(b)))
	copy(buf[4:], b)
	var oob []byte
	if f != nil {
		oob = unix.UnixRights(int(f.Fd()))
	}
	n, oobn, err := c.WriteMsgUnix(buf, oob, nil)
	if err != nil {
		return err
	}
	if oobn != len(oob) {
		return fmt.Errorf("sent %d of %d bytes of descriptors", oobn, len(oob))
	}
	// A stream socket may take part of a large frame: the rest carries no
	// descriptor.
	if n < len(buf) {
		_, err = c.Write(buf[n:])
	}
	return err
}

// readFrame reads one frame into v and returns the descriptor that came
// with it, if any.
func readFrame(c *net.UnixConn, v any) (*os.File, error) {
	var hdr [4]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	var f *os.File
	got := 0
	for got < len(hdr) {
		n, oobn, _, _, err := c.ReadMsgUnix(hdr[got:], oob)
		if oobn > 0 {
			files, perr := parseRights(oob[:oobn])
			for _, x := range files {
				if f == nil {
					f = x
				} else {
					x.Close() // more than the protocol sends
				}
			}
			if perr != nil {
				err = errors.Join(err, perr)
			}
		}
		got += n
		if err != nil {
			if got == 0 && errors.Is(err, io.EOF) {
				err = io.EOF
			} else if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			closeFile(f)
			return nil, err
		}
		if n == 0 {
			closeFile(f)
			return nil, io.EOF
		}
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if size > maxFrame {
		closeFile(f)
		return nil, fmt.Errorf("frame of %d bytes is larger than %d", size, maxFrame)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(c, b); err != nil {
		closeFile(f)
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	if err := json.Unmarshal(b, v); err != nil {
		closeFile(f)
		return nil, fmt.Errorf("decode frame: %w", err)
	}
	return f, nil
}

func parseRights(oob []byte) ([]*os.File, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var files []*os.File
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			// Received descriptors are not close-on-exec unless asked for.
			unix.CloseOnExec(fd)
			files = append(files, os.NewFile(uintptr(fd), "received"))
		}
	}
	return files, nil
}

func closeFile(f *os.File) {
	if f != nil {
		f.Close()
	}
}

// errorResponse turns err into a response: its message and its errdefs
// class's code, so that errors.Is works across the socket.
func errorResponse(err error) response {
	r := response{Err: err.Error()}
	if errdefs.Classified(err) {
		_, r.Class = errdefs.HTTPStatus(err)
	}
	return r
}

// err returns the response's error, or nil.
func (r response) err() error {
	if r.Err == "" {
		return nil
	}
	return errdefs.FromCode(r.Class, r.Err)
}

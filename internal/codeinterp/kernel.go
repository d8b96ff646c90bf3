package codeinterp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"
)

// kernelConfig says how to start a kernel.
type kernelConfig struct {
	// Python is the interpreter (python3) that runs ipykernel.
	Python string
	// Dir holds the kernel's connection file and sockets.
	Dir string
	// Cwd is the kernel's working directory.
	Cwd string
	// Env is the kernel process's environment.
	Env []string
}

// kernel is one running IPython kernel, talked to over ZeroMQ (Unix
// sockets) with Jupyter's messaging protocol. One cell runs at a time.
type kernel struct {
	cfg     kernelConfig
	sig     signer
	session string

	// busy holds one token: whoever has it runs a cell.
	busy chan struct{}

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
	cancel context.CancelFunc
	shell  zmq4.Socket
	iopub  zmq4.Socket
	subs   map[string]chan *message // by the msg_id of the request answered
	closed bool                     // close was called: never started again
}

// connectionFile is ipykernel's connection file (-f).
type connectionFile struct {
	Transport       string `json:"transport"`
	IP              string `json:"ip"`
	ShellPort       int    `json:"shell_port"`
	IOPubPort       int    `json:"iopub_port"`
	StdinPort       int    `json:"stdin_port"`
	ControlPort     int    `json:"control_port"`
	HBPort          int    `json:"hb_port"`
	Key             string `json:"key"`
	SignatureScheme string `json:"signature_scheme"`
	KernelName      string `json:"kernel_name"`
}

// startKernel starts a kernel and waits until it answers on its shell and
// iopub channels.
func startKernel(ctx context.Context, cfg kernelConfig) (*kernel, error) {
	k := &kernel{cfg: cfg, session: newID(), busy: make(chan struct{}, 1)}
	k.busy <- struct{}{}
	if err := k.start(ctx); err != nil {
		return nil, err
	}
	return k, nil
}

// start launches the kernel process and connects to it.
func (k *kernel) start(ctx context.Context) error {
	if err := os.MkdirAll(k.cfg.Dir, 0o700); err != nil {
		return err
	}
	// Unix sockets named <ip>-<port>: no port to pick, none to collide.
	key := newID()
	conn := connectionFile{Transport: "ipc", IP: filepath.Join(k.cfg.Dir, "k"), ShellPort: 1, IOPubPort: 2,
		StdinPort: 3, ControlPort: 4, HBPort: 5, Key: key, SignatureScheme: "hmac-sha256", KernelName: "python3"}
	for p := 1; p <= 5; p++ {
		os.Remove(fmt.Sprintf("%s-%d", conn.IP, p))
	}
	b, _ := json.Marshal(conn)
	connPath := filepath.Join(k.cfg.Dir, "connection.json")
	if err := os.WriteFile(connPath, b, 0o600); err != nil {
		return err
	}
	cmd := exec.Command(k.cfg.Python, "-m", "ipykernel_launcher", "-f", connPath)
	cmd.Dir = k.cfg.Cwd
	cmd.Env = k.cfg.Env
	// Its own process group: a SIGINT for the kernel reaches the processes
	// a cell started as well, and never this server.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	logf, err := os.Create(filepath.Join(k.cfg.Dir, "kernel.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the kernel (%s -m ipykernel_launcher): %w", k.cfg.Python, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()

	sctx, cancel := context.WithCancel(context.Background())
	k.mu.Lock()
	k.sig = signer{key: []byte(key)}
	k.cmd, k.exited, k.cancel = cmd, exited, cancel
	k.subs = map[string]chan *message{}
	k.mu.Unlock()
	if err := k.connect(ctx, sctx, conn); err != nil {
		k.stop()
		return fmt.Errorf("%w; kernel log: %s", err, tail(filepath.Join(k.cfg.Dir, "kernel.log")))
	}
	return nil
}

// connect waits for the kernel's sockets, dials them and waits until a
// kernel_info_request is answered on both shell and iopub (a SUB socket
// sees nothing published before it joined).
func (k *kernel) connect(ctx, sctx context.Context, conn connectionFile) error {
	shellPath := fmt.Sprintf("%s-%d", conn.IP, conn.ShellPort)
	iopubPath := fmt.Sprintf("%s-%d", conn.IP, conn.IOPubPort)
	for {
		_, e1 := os.Stat(shellPath)
		_, e2 := os.Stat(iopubPath)
		if e1 == nil && e2 == nil {
			break
		}
		select {
		case <-k.exited:
			return errors.New("the kernel exited while starting")
		case <-ctx.Done():
			return fmt.Errorf("the kernel did not open its sockets: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	shell := zmq4.NewDealer(sctx, zmq4.WithID(zmq4.SocketIdentity(k.session)))
	if err := shell.Dial("ipc://" + shellPath); err != nil {
		return fmt.Errorf("connect to the kernel's shell socket: %w", err)
	}
	iopub := zmq4.NewSub(sctx)
	if err := iopub.Dial("ipc://" + iopubPath); err != nil {
		shell.Close()
		return fmt.Errorf("connect to the kernel's iopub socket: %w", err)
	}
	if err := iopub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		shell.Close()
		iopub.Close()
		return err
	}
	k.mu.Lock()
	k.shell, k.iopub = shell, iopub
	k.mu.Unlock()
	go k.read(shell)
	go k.read(iopub)

	for {
		id := newID()
		sub := k.subscribe(id)
		err := k.send(id, "kernel_info_request", struct{}{})
		if err != nil {
			k.unsubscribe(id)
			return err
		}
		deadline := time.After(500 * time.Millisecond)
		seenIOPub := false
	wait:
		for {
			select {
			case m := <-sub:
				if m.Header.MsgType == "status" {
					seenIOPub = true
				}
				if seenIOPub {
					k.unsubscribe(id)
					return nil
				}
			case <-deadline:
				break wait
			case <-k.exited:
				k.unsubscribe(id)
				return errors.New("the kernel exited while starting")
			case <-ctx.Done():
				k.unsubscribe(id)
				return fmt.Errorf("the kernel did not answer: %w", ctx.Err())
			}
		}
		k.unsubscribe(id)
	}
}

// read hands every message from s to the subscriber of its parent.
func (k *kernel) read(s zmq4.Socket) {
	for {
		msg, err := s.Recv()
		if err != nil {
			return
		}
		k.mu.Lock()
		sig := k.sig
		k.mu.Unlock()
		m, err := sig.decode(msg.Frames)
		if err != nil {
			continue
		}
		k.mu.Lock()
		ch := k.subs[m.Parent.MsgID]
		k.mu.Unlock()
		if ch != nil {
			ch <- m
		}
	}
}

func (k *kernel) subscribe(id string) chan *message {
	ch := make(chan *message, 256)
	k.mu.Lock()
	k.subs[id] = ch
	k.mu.Unlock()
	return ch
}

// unsubscribe stops delivery to id's channel and drains it, so that a
// reader blocked on a full channel goes on.
func (k *kernel) unsubscribe(id string) {
	k.mu.Lock()
	ch := k.subs[id]
	delete(k.subs, id)
	k.mu.Unlock()
	for ch != nil {
		select {
		case <-ch:
		default:
			return
		}
	}
}

func (k *kernel) send(id, msgType string, content any) error {
	k.mu.Lock()
	sig, session, shell := k.sig, k.session, k.shell
	k.mu.Unlock()
	frames, err := sig.encode(session, id, msgType, content)
	if err != nil {
		return err
	}
	return shell.SendMulti(zmq4.NewMsgFrom(frames...))
}

// interrupt sends SIGINT to the kernel's process group (ipykernel's
// default interrupt mode): the running cell raises KeyboardInterrupt.
func (k *kernel) interrupt() {
	k.mu.Lock()
	cmd := k.cmd
	k.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
	}
}

// stop kills the kernel's process group and closes the sockets.
func (k *kernel) stop() {
	k.mu.Lock()
	cmd, exited, cancel := k.cmd, k.exited, k.cancel
	shell, iopub := k.shell, k.iopub
	k.shell, k.iopub, k.cmd = nil, nil, nil
	k.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
		}
	}
	if shell != nil {
		shell.Close()
	}
	if iopub != nil {
		iopub.Close()
	}
	if cancel != nil {
		cancel()
	}
}

// restart replaces the kernel's process with a new one (the variables
// are gone); the caller holds the busy token.
func (k *kernel) restart(ctx context.Context) error {
	k.stop()
	k.mu.Lock()
	closed := k.closed
	k.mu.Unlock()
	if closed {
		return errors.New("the context was removed")
	}
	return k.start(ctx)
}

// close stops the kernel for good: a cell still running ends, and
// nothing starts it again.
func (k *kernel) close() {
	k.mu.Lock()
	k.closed = true
	k.mu.Unlock()
	k.stop()
}

func (k *kernel) exitedChan() chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.exited
}

// tail returns the end of a log file for an error message.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(none)"
	}
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return strings.TrimSpace(string(b))
}

package envd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	pb "github.com/agentenv/agentenv/client/api/envd/processpb"
)

// openPTY makes a pseudo-terminal pair of the given size (as creack/pty
// does, with x/sys ioctls only, to keep envd's dependencies tiny). The
// command gets the terminal side; envd keeps the master.
func openPTY(size *pb.PTY_Size) (master, term *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	defer func() {
		if err != nil {
			master.Close()
		}
	}()
	fd := int(master.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		return nil, nil, fmt.Errorf("unlock the terminal: %w", err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		return nil, nil, fmt.Errorf("find the terminal's number: %w", err)
	}
	if err := setPTYSize(master, size); err != nil {
		return nil, nil, err
	}
	term, err = os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open the terminal: %w", err)
	}
	return master, term, nil
}

// setPTYSize sets the terminal's window size; the kernel sends SIGWINCH to
// its foreground process group when it changes.
func setPTYSize(master *os.File, size *pb.PTY_Size) error {
	if size.GetCols() == 0 || size.GetRows() == 0 || size.GetCols() > 0xffff || size.GetRows() > 0xffff {
		return errInvalidSize(size)
	}
	ws := &unix.Winsize{Col: uint16(size.GetCols()), Row: uint16(size.GetRows())}
	if err := unix.IoctlSetWinsize(int(master.Fd()), unix.TIOCSWINSZ, ws); err != nil {
		return fmt.Errorf("set the terminal size: %w", err)
	}
	return nil
}

var errPTYSize = errors.New("invalid terminal size")

func errInvalidSize(size *pb.PTY_Size) error {
	return fmt.Errorf("%w %dx%d (cols x rows): both must be 1..65535", errPTYSize, size.GetCols(), size.GetRows())
}

// ptySysProcAttr makes the command the leader of a new session whose
// controlling terminal is its stdin (the terminal side), as a login shell
// expects; its process group is its own, so signals still reach its group.
func ptySysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
}

// attachPTY gives the process a new terminal of the requested size.
func (p *proc) attachPTY(pty *pb.PTY, acct account) error {
	master, term, err := openPTY(pty.GetSize())
	if errors.Is(err, errPTYSize) {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	if err != nil {
		return connect.NewError(connect.CodeInternal, fmt.Errorf("create a PTY: %w", err))
	}
	// The terminal is the user's, as after a login: tools check its owner.
	if os.Getuid() == 0 && acct.UID != 0 {
		if err := term.Chown(int(acct.UID), int(acct.GID)); err != nil {
			master.Close()
			term.Close()
			return connect.NewError(connect.CodeInternal, fmt.Errorf("give the PTY to user %q: %w", acct.Name, err))
		}
	}
	cred := p.cmd.SysProcAttr.Credential
	p.cmd.SysProcAttr = ptySysProcAttr()
	p.cmd.SysProcAttr.Credential = cred
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = term, term, term
	p.tty, p.term = master, term
	return nil
}

// write sends input to the process: PTY input to its terminal, stdin to
// its stdin; each only where the process has it.
func (p *proc) write(in *pb.ProcessInput) error {
	if data, ok := in.GetInput().(*pb.ProcessInput_Pty); ok {
		if p.tty == nil {
			return connect.NewError(connect.CodeFailedPrecondition, errors.New("this process has no PTY: send its input as stdin"))
		}
		if _, err := p.tty.Write(data.Pty); err != nil {
			return connect.NewError(connect.CodeInternal, fmt.Errorf("write to the PTY of process %d: %w", p.pid, err))
		}
		return nil
	}
	return p.writeStdin(in.GetStdin())
}

// Update resizes a process's PTY.
func (ps *processService) Update(ctx context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if req.Msg.GetPty() != nil {
		if p.tty == nil {
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no PTY to resize", p.pid))
		}
		if err := setPTYSize(p.tty, req.Msg.GetPty().GetSize()); err != nil {
			if errors.Is(err, errPTYSize) {
				return nil, connect.NewError(connect.CodeInvalidArgument, err)
			}
			return nil, connect.NewError(connect.CodeInternal, err)
		}
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}

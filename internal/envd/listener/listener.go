// Package listener opens envd's listening socket as early as a Go program
// can: in a package init that depends only on the runtime, syscall and os,
// so it runs before the heavy initialization of the rest of envd (protobuf
// descriptors, net/http, crypto; tens of ms inside gVisor). From then on
// the host's first connection is accepted by the sandbox's network stack
// and waits in the backlog until envd serves, instead of being refused and
// tried again: the server's wait for envd ends when envd answers, not at
// its next poll.
//
// It must stay tiny: no import beyond syscall, os and envdapi (constants,
// importing nothing), or its init moves after the packages it exists to
// precede. Only cmd/envd imports it, and
// its init acts only in the sandbox's init process (pid 1), without a
// -listen or -version flag: nothing else that links it listens.
package listener

import (
	"os"
	"syscall"

	"github.com/agentenv/agentenv/internal/envdapi"
)

// early is the socket the init opened (nil if it did not).
var early *os.File

func init() {
	if os.Getpid() != 1 {
		return
	}
	for _, a := range os.Args[1:] {
		// Another address, or no server at all: main decides.
		for len(a) > 0 && a[0] == '-' {
			a = a[1:]
		}
		if len(a) >= 6 && a[:6] == "listen" || a == "version" || a == "h" || a == "help" {
			return
		}
	}
	early = open(envdapi.Port)
}

// open listens on 0.0.0.0:port with raw system calls (package net would
// pull in its own initialization); nil on any failure.
func open(port int) *os.File {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC|syscall.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil
	}
	if syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) != nil ||
		syscall.Bind(fd, &syscall.SockaddrInet4{Port: port}) != nil ||
		syscall.Listen(fd, syscall.SOMAXCONN) != nil {
		syscall.Close(fd)
		return nil
	}
	return os.NewFile(uintptr(fd), "envd-listener")
}

// Take returns the socket listening on 0.0.0.0:envdapi.Port that the init opened,
// once (nil: it opened none, or it was taken; listen the usual way).
func Take() *os.File {
	f := early
	early = nil
	return f
}

package runtimetest

import "golang.org/x/sys/unix"

func unixSetxattr(path, name, value string) error { return unix.Setxattr(path, name, []byte(value), 0) }

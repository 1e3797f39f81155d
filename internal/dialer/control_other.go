//go:build !linux

package dialer

import "syscall"

// control leaves the socket alone where TCP_USER_TIMEOUT does not exist.
func control(_, _ string, _ syscall.RawConn) error { return nil }

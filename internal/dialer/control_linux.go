package dialer

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// control sets TCP_USER_TIMEOUT on TCP sockets; other sockets (Unix
// domain sockets to a local PostgreSQL) are left alone.
func control(network, _ string, c syscall.RawConn) error {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil
	}
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(UserTimeout.Milliseconds()))
	})
	if err != nil {
		return err
	}
	return serr
}

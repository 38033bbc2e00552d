package edge

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// unreadBytes reports whether the kernel holds bytes of c that the server
// has not read yet (SIOCINQ on its socket); false when it cannot tell.
func unreadBytes(c net.Conn) bool {
	if w, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = w.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	if err := rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) }); err != nil {
		return false
	}
	return n > 0
}

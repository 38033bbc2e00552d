//go:build !linux

package edge

import "net"

// unreadBytes reports whether the kernel holds bytes of c that the server
// has not read yet; on this system it cannot tell, and says no.
func unreadBytes(net.Conn) bool { return false }

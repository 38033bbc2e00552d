package cli

import (
	"fmt"
	"io"

	"breakwater/storage/postgres"
)

// printConns says what the server has of connections and how many
// instances with a pool of pool fit in them beside its other clients,
// and warns when one more than those running now would not: past
// max_connections an instance gets no new connection, and refuses the
// reads that need one (503).
func printConns(out io.Writer, c postgres.Conns, pool int) {
	room := c.Room(pool)
	fmt.Fprintf(out, "storage: connections: %d of %d usable in use (max_connections %d less %d reserved), %d of them Breakwater's; "+
		"%d %s running; each opens up to %d (storage.postgres_max_connections %d and a listener): room for %d %s at their full pool\n",
		c.InUse+1, c.Usable(), c.Max, c.Reserved, c.Breakwater, c.Instances, plural(c.Instances, "instance", "instances"),
		pool+1, pool, room, plural(room, "instance", "instances"))
	if room < c.Instances+1 {
		fmt.Fprintf(out, "warning: the server's connections leave room for %d %s at storage.postgres_max_connections = %d, and %d %s running: "+
			"one more could exhaust max_connections, and an instance that gets no connection refuses paid reads (503): "+
			"lower storage.postgres_max_connections, run fewer instances or raise max_connections\n",
			room, plural(room, "instance", "instances"), pool, c.Instances, plural(c.Instances, "is", "are"))
	}
}

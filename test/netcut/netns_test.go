package netcut

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// netns is a network namespace of the test's own, joined to the host by a
// veth pair on a private /30: the host's end has HostIP, the namespace's
// NSIP. A process started through Wrap runs inside it and reaches the
// host (the database, its fake Gemini) only over the veth, as a second
// machine would; the test reaches it over the same veth.
type netns struct {
	t      *testing.T
	Name   string
	HostIP string
	NSIP   string
	Subnet string // HostIP's /30, for pg_hba.conf
	host   string // the veth's host end
}

// nsPrefix starts the name of every namespace the package makes; the
// creating process's id follows, so a namespace a killed run left behind
// is known and removed by the next run (sweepNamespaces).
const nsPrefix = "bwcut-"

var nsSeq struct {
	sync.Mutex
	n int
}

// tool returns the path of a program the tests need, failing t without it.
func tool(t *testing.T, name, pkg string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin", "/sbin"} {
		if p := filepath.Join(dir, name); isExec(p) {
			return p
		}
	}
	t.Fatalf("%s is needed (Debian's %s; .ci/run installs it)", name, pkg)
	return ""
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// run runs a command, bounded to 10 s, failing t with its output.
func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := runErr(name, args...); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

func runErr(name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, name, args...).CombinedOutput()
}

// newNetns makes a namespace and its veth pair, removed when t ends (the
// namespace's end of the veth goes with the namespace, the host's end
// with it). It needs root, and fails t without it.
func newNetns(t *testing.T) *netns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the network namespace tests need root (ip netns, nft); run them as root")
	}
	ip := tool(t, "ip", "iproute2")
	nsSeq.Lock()
	nsSeq.n++
	seq := nsSeq.n
	nsSeq.Unlock()
	pid := os.Getpid()
	n := &netns{t: t, Name: fmt.Sprintf("%s%d-%d", nsPrefix, pid, seq)}
	// Interface names are at most 15 bytes: "bw" + pid (7 digits at
	// most) + "h"/"n" + sequence.
	n.host = fmt.Sprintf("bw%dh%d", pid, seq)
	peer := fmt.Sprintf("bw%dn%d", pid, seq)
	if err := n.pickSubnet(); err != nil {
		t.Fatal(err)
	}
	run(t, ip, "netns", "add", n.Name)
	t.Cleanup(n.remove)
	run(t, ip, "link", "add", n.host, "type", "veth", "peer", "name", peer)
	run(t, ip, "link", "set", peer, "netns", n.Name)
	run(t, ip, "addr", "add", n.HostIP+"/30", "dev", n.host)
	run(t, ip, "link", "set", n.host, "up")
	run(t, ip, "netns", "exec", n.Name, ip, "addr", "add", n.NSIP+"/30", "dev", peer)
	run(t, ip, "netns", "exec", n.Name, ip, "link", "set", peer, "up")
	run(t, ip, "netns", "exec", n.Name, ip, "link", "set", "lo", "up")
	return n
}

// pickSubnet takes a random /30 in 10.224.0.0/12 that no interface of the
// host uses: two runs at once (or another test's veths) cannot collide.
func (n *netns) pickSubnet() error {
	for range 50 {
		var b [4]byte
		_, _ = rand.Read(b[:])
		v := binary.BigEndian.Uint32(b[:])
		base := uint32(10<<24|224<<16) | (v&0xfffff)&^3 // in 10.224.0.0/12, on a /30 boundary
		sub := u32IP(base)
		if used, err := subnetUsed(sub); err != nil {
			return err
		} else if used {
			continue
		}
		n.Subnet = sub.String() + "/30"
		n.HostIP, n.NSIP = u32IP(base+1).String(), u32IP(base+2).String()
		return nil
	}
	return fmt.Errorf("no free /30 in 10.224.0.0/12")
}

func u32IP(v uint32) net.IP {
	return net.IPv4(byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}

// subnetUsed reports whether an address of the host is in sub's /30.
func subnetUsed(sub net.IP) (bool, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false, err
	}
	_, block, _ := net.ParseCIDR(sub.String() + "/30")
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && (block.Contains(ipn.IP) || ipn.Contains(sub)) {
			return true, nil
		}
	}
	return false, nil
}

// remove deletes the namespace and the host's end of the veth. The
// processes in it have been stopped by then (their Cleanup runs first).
func (n *netns) remove() {
	ip := tool(n.t, "ip", "iproute2")
	if out, err := runErr(ip, "netns", "del", n.Name); err != nil {
		n.t.Errorf("ip netns del %s: %v\n%s", n.Name, err, out)
	}
	// The pair goes with the namespace's end, but the kernel may not be
	// done yet: a device already gone is what is wanted.
	if out, err := runErr(ip, "link", "del", n.host); err != nil && !gone(out) {
		n.t.Errorf("ip link del %s: %v\n%s", n.host, err, out)
	}
}

// gone reports ip's answer for a device that does not exist.
func gone(out []byte) bool {
	return bytes.Contains(out, []byte("Cannot find device")) || bytes.Contains(out, []byte("does not exist"))
}

// Wrap writes an executable script into dir that runs bin inside the
// namespace with the script's arguments: `ip netns exec` execs bin, so
// the process the harness starts (and signals) is bin itself.
func (n *netns) Wrap(dir, bin string) string {
	n.t.Helper()
	ip := tool(n.t, "ip", "iproute2")
	path := filepath.Join(dir, "in-"+n.Name)
	script := fmt.Sprintf("#!/bin/sh\nexec %s netns exec %s %s \"$@\"\n", ip, n.Name, bin)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		n.t.Fatal(err)
	}
	return path
}

// cutTable is the nftables table of a cut, in the namespace's own
// ruleset (a namespace has its own, gone with it).
const cutTable = "bwcut"

// Cut drops, inside the namespace, every packet to and from port on the
// host's end: the database's connections see a dead link (no reset, no
// error, retransmissions unanswered), while the namespace's other
// traffic (its clients, its fake Gemini) flows as before.
func (n *netns) Cut(port int) {
	n.t.Helper()
	nft := tool(n.t, "nft", "nftables")
	rules := fmt.Sprintf(`table inet %[1]s {
	chain out { type filter hook output priority 0; policy accept; ip daddr %[2]s tcp dport %[3]d drop; }
	chain in { type filter hook input priority 0; policy accept; ip saddr %[2]s tcp sport %[3]d drop; }
}
`, cutTable, n.HostIP, port)
	cmd := exec.Command(tool(n.t, "ip", "iproute2"), "netns", "exec", n.Name, nft, "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		n.t.Fatalf("nft -f (the cut): %v\n%s", err, out)
	}
}

// Mend lifts the cut.
func (n *netns) Mend() {
	n.t.Helper()
	run(n.t, tool(n.t, "ip", "iproute2"), "netns", "exec", n.Name, tool(n.t, "nft", "nftables"), "delete", "table", "inet", cutTable)
}

// Reach reports whether a TCP connection from inside the namespace to
// addr opens within limit (bash's /dev/tcp, under timeout(1)): the check
// that a cut cuts, and that the link is whole again.
func (n *netns) Reach(addr string, limit time.Duration) bool {
	n.t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	secs := strconv.FormatFloat(limit.Seconds(), 'f', 3, 64)
	out, err := runErr(tool(n.t, "ip", "iproute2"), "netns", "exec", n.Name, "timeout", secs,
		"bash", "-c", fmt.Sprintf("exec 3<>/dev/tcp/%s/%s", host, port))
	if err != nil && len(out) > 0 {
		n.t.Logf("reach %s from %s: %v: %s", addr, n.Name, err, out)
	}
	return err == nil
}

var nsNameRE = regexp.MustCompile(`^` + nsPrefix + `(\d+)-\d+`)

// sweepNamespaces removes the namespaces of this package that a run
// killed before its cleanup left behind: those whose creator is gone.
func sweepNamespaces(w io.Writer) {
	ip, err := exec.LookPath("ip")
	if err != nil {
		ip = "/usr/sbin/ip"
	}
	out, err := runErr(ip, "netns", "list")
	if err != nil {
		return
	}
	for line := range strings.Lines(string(out)) {
		m := nsNameRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue // its run is alive
		}
		name := strings.Fields(line)[0]
		if out, err := runErr(ip, "netns", "del", name); err != nil {
			fmt.Fprintf(w, "netcut: remove the stale namespace %s: %v %s\n", name, err, out)
		} else {
			fmt.Fprintf(w, "netcut: removed the stale namespace %s\n", name)
		}
	}
}

// Package netcut holds the tests of an instance cut off from the
// database: two real breakwater binaries on one PostgreSQL cluster of the
// test's own, one of them in a network namespace that reaches the
// database over a veth pair, as a second machine would. The tests drop
// that instance's packets to and from the database (nftables, in the
// namespace) for 5 s and for 40 s, and slow its link with 200 ms more
// round-trip time, while both instances serve, and check what
// docs/INSTANCES.md promises. They need root (ip netns, nft) and
// Debian's iproute2 and nftables, and fail, never skip, without them.
// Every namespace and veth is removed when its test ends; one a killed
// run left behind is removed by the next run.
package netcut

// Package disk holds the tests of a full and of a read-only disk under the
// real binary: the database on a small tmpfs filled to the last byte, and
// on an ext4 filesystem that turns read-only under the running server.
// They need root (mount, losetup) and fail, never skip, without it.
package disk

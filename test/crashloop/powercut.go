package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// diskBytes is the size of the power-cut disk image.
const diskBytes = 128 << 20

// disk is an ext4 filesystem on a loop device whose backing file is the
// "platter": what the loop device has received is in the file, what is
// still in the page cache of the filesystem on top is not.
type disk struct {
	img string // backing file
	mnt string // mount point
	dev string // /dev/loopN, "" when detached
}

func newDisk(ctx context.Context, dir string) (*disk, error) {
	d := &disk{img: filepath.Join(dir, "disk.img"), mnt: filepath.Join(dir, "mnt")}
	if err := os.MkdirAll(d.mnt, 0o700); err != nil {
		return nil, err
	}
	f, err := os.Create(d.img)
	if err != nil {
		return nil, err
	}
	if err := f.Truncate(diskBytes); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	if _, err := sh(ctx, "mkfs.ext4", "-q", "-F", d.img); err != nil {
		return nil, err
	}
	if err := d.attach(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *disk) attach(ctx context.Context) error {
	dev, err := sh(ctx, "losetup", "--find", "--show", d.img)
	if err != nil {
		return fmt.Errorf("power cut needs a loop device: %w", err)
	}
	d.dev = dev
	if _, err := sh(ctx, "mount", "-t", "ext4", d.dev, d.mnt); err != nil {
		_, _ = sh(ctx, "losetup", "--detach", d.dev)
		d.dev = ""
		return err
	}
	return nil
}

// cut simulates a power cut right after a kill: it copies the backing
// file as it is now (what reached the device), throws away the mounted
// filesystem with its page cache, and boots the copy: mounting it replays
// ext4's journal, as after a real power loss.
func (d *disk) cut(ctx context.Context) error {
	cut := d.img + ".cut"
	if err := copyFile(cut, d.img); err != nil {
		return fmt.Errorf("power cut: %w", err)
	}
	if err := d.detach(ctx); err != nil {
		return err
	}
	if err := os.Rename(cut, d.img); err != nil {
		return err
	}
	return d.attach(ctx)
}

func (d *disk) detach(ctx context.Context) error {
	if d.dev == "" {
		return nil
	}
	if _, err := sh(ctx, "umount", d.mnt); err != nil {
		return err
	}
	if _, err := sh(ctx, "losetup", "--detach", d.dev); err != nil {
		return err
	}
	d.dev = ""
	return nil
}

func (d *disk) close() error { return d.detach(context.Background()) }

func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// sh runs a command and returns its trimmed standard output.
func sh(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

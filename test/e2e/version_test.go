package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestVersionNamesTheRevision builds the binary from this checkout with go
// build and asserts that `breakwater version` names the commit of HEAD,
// its time and whether the checkout had uncommitted changes, from the
// build information Go records. Go records none in a linked worktree
// (its .git is a file: golang/go#58218), so there the binary is built
// from a clone of HEAD with the worktree's changes copied in;
// -buildvcs=true overrides a GOFLAGS that turns it off. It needs git, and
// fails without it.
func TestVersionNamesTheRevision(t *testing.T) {
	t.Parallel() // a build of its own; it only reads the checkout
	if testing.Short() {
		t.Skip("builds the binary")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	git := func(dir string, args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, "git", append([]string{"-C", dir}, args...)...).Output()
		if err != nil {
			t.Fatalf("git %s: %v", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out))
	}
	src, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	head := git(src, "rev-parse", "HEAD")
	modified := git(src, "status", "--porcelain") != ""
	if fi, err := os.Stat(filepath.Join(src, ".git")); err != nil {
		t.Fatalf("not a git checkout: %v", err)
	} else if !fi.IsDir() {
		src = worktreeClone(t, src, head, git)
	}
	bin := filepath.Join(t.TempDir(), "breakwater")
	build := exec.CommandContext(ctx, "go", "build", "-buildvcs=true", "-o", bin, ".")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.CommandContext(ctx, bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("breakwater version: %v\n%s", err, out)
	}
	got := string(out)
	commitTime, err := time.Parse(time.RFC3339, git(src, "show", "-s", "--format=%cI", head))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got, "breakwater v") && !strings.HasPrefix(got, "breakwater (devel)") {
		t.Errorf("breakwater version printed\n%s\nwant it to start with the module's version", got)
	}
	for _, want := range []string{
		"revision: " + head + "\n",
		"time:     " + commitTime.UTC().Format(time.RFC3339) + "\n",
		"modified: " + map[bool]string{true: "true", false: "false"}[modified] + "\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("breakwater version printed\n%s\nwant a line %q", got, want)
		}
	}
}

// worktreeClone clones the repository of the linked worktree dir at head
// into a temporary folder and copies in the worktree's uncommitted
// changes and untracked files, so that what is built is what dir holds.
func worktreeClone(t *testing.T, dir, head string, git func(dir string, args ...string) string) string {
	t.Helper()
	clone := t.TempDir()
	git(dir, "clone", "--quiet", "--shared", "--no-checkout", ".", clone)
	git(clone, "checkout", "--quiet", "--detach", head)
	changed := git(dir, "diff", "--name-only", "HEAD")
	untracked := git(dir, "ls-files", "--others", "--exclude-standard")
	for _, name := range strings.Fields(changed + "\n" + untracked) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if os.IsNotExist(err) {
			os.Remove(filepath.Join(clone, name)) // deleted in the worktree
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(clone, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(clone, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return clone
}

package main

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The documents whose relative links must resolve: the README, the
// reference under docs/ and the benchmark's README.
func linkedDocs(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("no docs/*.md")
	}
	return append([]string{"README.md", "bench/README.md"}, docs...)
}

var (
	mdLink     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	codeSpan   = regexp.MustCompile("`[^`]*`")
	headingRE  = regexp.MustCompile(`^#{1,6} +(.+?) *#*$`)
	notInSlug  = regexp.MustCompile(`[^\p{L}\p{N}_\- ]`)
	schemeLink = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// mdLines are a document's lines outside fenced code blocks.
func mdLines(text string) []string {
	var out []string
	fence := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fence = !fence
			continue
		}
		if !fence {
			out = append(out, l)
		}
	}
	return out
}

// anchors are the ids GitHub gives a document's headings: lower case,
// punctuation dropped, spaces as hyphens, a repeat suffixed -1, -2, ...
func anchors(text string) map[string]bool {
	ids := map[string]bool{}
	seen := map[string]int{}
	for _, l := range mdLines(text) {
		m := headingRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		id := strings.ReplaceAll(notInSlug.ReplaceAllString(strings.ToLower(m[1]), ""), " ", "-")
		if n := seen[id]; n > 0 {
			ids[fmt.Sprintf("%s-%d", id, n)] = true
		} else {
			ids[id] = true
		}
		seen[id]++
	}
	return ids
}

// TestDocLinksResolve: every relative link in README.md, docs/*.md and
// bench/README.md names a file or folder of the repository, and an
// #anchor names a heading of the document it points into, so a section
// that moves cannot leave a dead link behind.
func TestDocLinksResolve(t *testing.T) {
	texts := map[string]string{}
	read := func(name string) (string, error) {
		if s, ok := texts[name]; ok {
			return s, nil
		}
		b, err := os.ReadFile(filepath.FromSlash(name))
		texts[name] = string(b)
		return string(b), err
	}
	checked := 0
	for _, doc := range linkedDocs(t) {
		text, err := read(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range mdLines(text) {
			for _, m := range mdLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(l, ""), -1) {
				target := m[1]
				if schemeLink.MatchString(target) {
					continue // http(s), mailto: not ours to check
				}
				checked++
				file, anchor, _ := strings.Cut(target, "#")
				name := doc
				if file != "" {
					name = path.Join(path.Dir(doc), file)
					if strings.HasPrefix(name, "../") || path.IsAbs(file) {
						t.Errorf("%s: link %s leaves the repository", doc, target)
						continue
					}
					if _, err := os.Stat(filepath.FromSlash(name)); err != nil {
						t.Errorf("%s: link %s: no file %s", doc, target, name)
						continue
					}
				}
				if anchor == "" {
					continue
				}
				if !strings.HasSuffix(name, ".md") {
					t.Errorf("%s: link %s: an anchor into %s, which is not Markdown", doc, target, name)
					continue
				}
				linked, err := read(name)
				if err != nil {
					t.Errorf("%s: link %s: %v", doc, target, err)
					continue
				}
				if !anchors(linked)[anchor] {
					t.Errorf("%s: link %s: %s has no heading #%s", doc, target, name, anchor)
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d relative links found; the link pattern no longer matches the docs", checked)
	}
}

// TestReadmeIsAFrontDoor keeps the README short enough to read first,
// with its contents list; the reference lives in docs/.
func TestReadmeIsAFrontDoor(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > 350 {
		t.Errorf("README.md has %d lines, at most 350: move reference to docs/", n)
	}
	if !anchors(string(b))["contents"] {
		t.Error("README.md has no ## Contents")
	}
}

func TestAnchors(t *testing.T) {
	got := anchors("# Breakwater\n## Gemini's own spend cap: the outer wall\n```\n# not a heading\n```\n## Retries are paid once: Idempotency-Key\n## Caddy\n### Caddy\n")
	for _, id := range []string{"breakwater", "geminis-own-spend-cap-the-outer-wall", "retries-are-paid-once-idempotency-key", "caddy", "caddy-1"} {
		if !got[id] {
			t.Errorf("no anchor %q in %v", id, got)
		}
	}
	if got["not-a-heading"] {
		t.Error("a comment in a code block taken for a heading")
	}
}

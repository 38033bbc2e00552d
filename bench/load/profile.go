package main

// -profile: a CPU profile of each Breakwater case, fetched from the
// instance's admin listener (server.admin_pprof) during the first round.

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// profileCase fetches a CPU profile of the instance serving c for the
// measured time, rounded up to whole seconds (what /debug/pprof/profile
// takes), and writes it to plan.profile/SLUG.pprof. A profile that cannot
// be had is reported by benchmark after the run.
func (b *bench) profileCase(c tcase, measured time.Duration) {
	path := filepath.Join(b.plan.profile, slug(c.label)+".pprof")
	if err := c.bw.cpuProfile(path, profileSeconds(measured)); err != nil {
		b.profileErr = errors.Join(b.profileErr, fmt.Errorf("case %q: %w", c.label, err))
		return
	}
	b.profiles = append(b.profiles, path)
}

// profileSeconds is d rounded up to whole seconds, at least one.
func profileSeconds(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}

// cpuProfile asks the running instance for a CPU profile of the next
// seconds and writes it to path.
func (b *breakwater) cpuProfile(path string, seconds int) error {
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", b.admin, seconds)
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+b.token)
	client := &http.Client{Timeout: time.Duration(seconds)*time.Second + 30*time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("%s: CPU profile: %w", b.name, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("%s: CPU profile: %w", b.name, err)
	}
	if resp.StatusCode != http.StatusOK || len(data) == 0 {
		return fmt.Errorf("%s: CPU profile: status %d, %d bytes: %.200s", b.name, resp.StatusCode, len(data), data)
	}
	return os.WriteFile(path, data, 0o644)
}

// slug names a case's file: its label in lower case, each run of other
// characters than letters and digits a single "-" ("accepted, 1,000
// users, ceilings on" is "accepted-1000-users-ceilings-on").
func slug(label string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(strings.ReplaceAll(label, ",", "")) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			b.WriteRune(r)
			dash = false
			continue
		}
		dash = true
	}
	return b.String()
}

// printProfiles says where the CPU profiles are and how to read them.
func printProfiles(w io.Writer, paths []string, measured time.Duration) {
	if len(paths) == 0 {
		return
	}
	fmt.Fprintf(w, "CPU profiles of the first round's Breakwater cases (%ds each, over the measured time):\n", profileSeconds(measured))
	for _, p := range paths {
		fmt.Fprintln(w, "  "+p)
	}
	fmt.Fprintf(w, "read one with: go tool pprof -top %s\n", paths[0])
	fmt.Fprintf(w, "           or: go tool pprof -http=127.0.0.1:0 %s\n", paths[0])
}

package cli

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"breakwater/detect"
	"breakwater/server/app"
	"breakwater/server/guard/replay"
)

func thresholdsCmd(e *env) *cobra.Command {
	var (
		days   int
		to     string
		asJSON bool
	)
	c := &cobra.Command{
		Use:   "thresholds [--days 14] [--to YYYY-MM-DD] [--json]",
		Short: "what each layer measures of the recorded traffic, and suggested lines",
		Long: `Measure the recorded traffic of the last --days days (up to --to, default
today, included) as each
layer counts it: requests per user in any [limits.user] window and in any
second, attempts per user per day, invite checks per client IP in any
[invites] window and in any second, and the longest runs of refused invite
checks per IP and per e-mail. Each key counts by its peak; the distribution
over keys is printed as p50, p90, p99, p99.9 and max, apart for the keys
left out and for the rest, with for each layer the line that would have
refused none of the rest, 50% above their highest peak (at least one
more). Left out are the keys a detector flagged (detect findings) and
those the limits marked in the range: refused by a limit (for real, at the
layer measured or before it) or cooled down by the invite fail limit; the
output says how many per reason. A layer counts only the requests that
reached it: attempts per day leave out what layer 1 refused. Writes
nothing.`,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, _ []string) error {
			if days < 1 {
				return usageErrorf(c, "--days %d: want at least 1", days)
			}
			cfg, err := app.Load(e.config, e.getenv)
			if err != nil {
				return err
			}
			loc, _ := cfg.Budget.Location() // checked by Load
			start, end, err := dayRange(c, "", to, days, loc)
			if err != nil {
				return err
			}
			m := replay.NewMeasurer(replay.Windows{User: cfg.Limits.User.Window, Invites: cfg.Invites.Window}, loc)
			findings, err := e.recorded(c.Context(), cfg, start, end, func(ev detect.Event) error { m.Add(ev); return nil })
			if err != nil {
				return err
			}
			rep := m.Report(findings, day(start, loc), day(end.Add(-time.Nanosecond), loc))
			if asJSON {
				return printOut(e.stdout, true, rep, "", nil)
			}
			return printThresholds(e.stdout, rep)
		},
	}
	c.Flags().IntVar(&days, "days", 14, "how many days back, --to included, `N`")
	c.Flags().StringVar(&to, "to", "", "the last day, `YYYY-MM-DD` (default: today)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return c
}

func printThresholds(w io.Writer, rep replay.ThresholdReport) error {
	fmt.Fprintf(w, "recorded traffic of %s to %s, each key by its peak; suggested: %s\n", rep.From, rep.To, rep.Margin)
	dist := func(d replay.Distribution) string {
		if d.Keys == 0 {
			return "-"
		}
		return fmt.Sprintf("%d keys: %d/%d/%d/%d/%d", d.Keys, d.P50, d.P90, d.P99, d.P999, d.Max)
	}
	err := printOut(w, false, rep, "LAYER\tMEASURE\tMEASURED p50/p90/p99/p99.9/max\tLEFT OUT p50/p90/p99/p99.9/max\tSUGGESTED", func(row func(...any)) {
		for _, l := range rep.Layers {
			suggested := "-"
			if l.Suggested > 0 {
				suggested = fmt.Sprint(l.Suggested)
			}
			row(l.Layer, l.Measure, dist(l.Unflagged), dist(l.Flagged), suggested)
		}
	})
	if err != nil {
		return err
	}
	for _, l := range rep.Layers {
		if len(l.LeftOut) == 0 {
			continue
		}
		var parts []string
		for _, why := range slices.Sorted(maps.Keys(l.LeftOut)) {
			parts = append(parts, fmt.Sprintf("%d %s", l.LeftOut[why], why))
		}
		fmt.Fprintf(w, "%s: left out of the suggested line: %d %s (%s)\n", l.Layer, l.Flagged.Keys, plural(l.Flagged.Keys, "key", "keys"), strings.Join(parts, ", "))
	}
	return nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

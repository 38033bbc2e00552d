package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"breakwater/detect"
	"breakwater/server/app"
	"breakwater/server/guard/replay"
)

// defaultReplayDays is how many days a replay covers without --from.
const defaultReplayDays = 7

func replayCmd(e *env) *cobra.Command {
	var (
		candidate, from, to string
		asJSON              bool
	)
	c := &cobra.Command{
		Use:   "replay --candidate FILE [--from YYYY-MM-DD] [--to YYYY-MM-DD] [--json]",
		Short: "what a candidate config's limits would have refused of the recorded traffic",
		Long: `Replay the recorded statistics events of the days from --from to --to
(default: the last 7 days, today included, in budget.timezone) in time order
on a simulated clock through the limits of the config in force (--config)
and of the candidate (--candidate): layer 1 ([limits.user]), each plan's
daily line, the [invites] IP rate limit and each [[routes]] entry's rate,
burst and daily line (a layer "route:NAME" each). Prints per layer the requests
seen, refused, distinct keys refused and the ten keys refused most, under
each config (a layer no recorded request reached says so), then the
differences. A request layer 1 refused when recorded stays refused under
the current limits and under a candidate's equal ones, and reaches no
later layer; rows of refusals counted per minute are replayed as counts. Modes are ignored: a replay says what
each layer would refuse. Writes nothing: with the server stopped it reads
the database read only, while it runs its admin API.`,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, _ []string) error {
			if candidate == "" {
				return usageErrorf(c, "missing --candidate FILE")
			}
			cur, err := app.Load(e.config, e.getenv)
			if err != nil {
				return err
			}
			cand, err := app.Load(candidate, e.getenv)
			if err != nil {
				return fmt.Errorf("candidate: %w", err)
			}
			loc, _ := cur.Budget.Location() // checked by Load
			start, end, err := dayRange(c, from, to, defaultReplayDays, loc)
			if err != nil {
				return err
			}
			r, err := replay.NewReplayer(cur.ReplayLimits(), cand.ReplayLimits(), loc)
			if err != nil {
				return err
			}
			if _, err := e.recorded(c.Context(), cur, start, end, func(ev detect.Event) error { r.Add(ev); return nil }); err != nil {
				return err
			}
			rep := r.Report(day(start, loc), day(end.Add(-time.Nanosecond), loc))
			if asJSON {
				return printOut(e.stdout, true, rep, "", nil)
			}
			return printReplay(e.stdout, rep)
		},
	}
	c.Flags().StringVar(&candidate, "candidate", "", "the candidate config, `FILE` (the config in force is --config)")
	c.Flags().StringVar(&from, "from", "", "the first day, `YYYY-MM-DD` (default: 6 days before --to)")
	c.Flags().StringVar(&to, "to", "", "the last day, `YYYY-MM-DD` (default: today)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return c
}

// recorded reads the statistics of [from, to) without writing: each
// event to fn as it is read, in time order, then the findings.
func (e *env) recorded(ctx context.Context, cfg app.Config, from, to time.Time, fn func(detect.Event) error) ([]detect.Finding, error) {
	r, closeR, err := app.OpenRecorded(cfg, app.Options{Getenv: e.getenv})
	if err != nil {
		return nil, err
	}
	defer closeR()
	return r.EachRecorded(ctx, from, to, fn)
}

// dayRange is [start of from, end of to) in loc; to defaults to today,
// from to days-1 days before to.
func dayRange(c *cobra.Command, from, to string, days int, loc *time.Location) (start, end time.Time, err error) {
	parse := func(flag, v string) (time.Time, error) {
		t, err := time.ParseInLocation("2006-01-02", v, loc)
		if err != nil {
			return time.Time{}, usageErrorf(c, "--%s %q: want a day, YYYY-MM-DD", flag, v)
		}
		return t, nil
	}
	now := time.Now().In(loc)
	last := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, loc)
	if to != "" {
		if last, err = parse("to", to); err != nil {
			return
		}
	}
	first := last.AddDate(0, 0, -(days - 1))
	if from != "" {
		if first, err = parse("from", from); err != nil {
			return
		}
	}
	if first.After(last) {
		return start, end, usageErrorf(c, "--from %s is after --to %s", day(first, loc), day(last, loc))
	}
	return first, last.AddDate(0, 0, 1), nil
}

func day(t time.Time, loc *time.Location) string { return t.In(loc).Format("2006-01-02") }

// printReplay prints both configs side by side per layer, then the
// differences.
func printReplay(w io.Writer, rep replay.Report) error {
	fmt.Fprintf(w, "replay of %s to %s", rep.From, rep.To)
	if rep.DroppedEvents > 0 {
		fmt.Fprintf(w, "; %d events were lost when recorded (a full queue or a failed write) and are missing from it", rep.DroppedEvents)
	}
	fmt.Fprintln(w)
	err := printOut(w, false, rep, "LAYER\tCONFIG\tREQUESTS\tREFUSED\tKEYS REFUSED\tREFUSED MOST", func(row func(...any)) {
		for _, l := range rep.Layers {
			if l.Note != "" {
				row(l.Layer, "both", l.Current.Requests, l.Current.Refused, l.Current.KeysRefused, "note: "+l.Note)
				continue
			}
			for _, side := range []struct {
				name string
				o    replay.Outcome
			}{{"current", l.Current}, {"candidate", l.Candidate}} {
				row(l.Layer, side.name, side.o.Requests, side.o.Refused, side.o.KeysRefused, topText(side.o.Top))
			}
		}
	})
	if err != nil {
		return err
	}
	for _, d := range rep.Differences {
		fmt.Fprintln(w, d)
	}
	for _, n := range rep.Notes {
		if !strings.HasSuffix(n, replay.NoteNoTraffic) { // said in the table
			fmt.Fprintln(w, "note: "+n)
		}
	}
	return nil
}

func topText(top []replay.KeyCount) string {
	if len(top) == 0 {
		return "-"
	}
	parts := make([]string, len(top))
	for i, k := range top {
		parts[i] = fmt.Sprintf("%s %d", k.Key, k.Refused)
	}
	return strings.Join(parts, ", ")
}

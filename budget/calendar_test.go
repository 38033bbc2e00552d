package budget

import (
	"sync"
	"testing"
	"time"
)

func mustZone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// The remembered day must give exactly what formatting gives, at every
// boundary: midnight, the turn of a month and year, and days of 23 and 25
// hours when the clocks change.
func TestCalendarMatchesFormatting(t *testing.T) {
	for _, zone := range []string{"UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu", "America/Havana"} {
		loc := mustZone(t, zone)
		cal := NewCalendar(loc)
		// Every 7 minutes through a year that holds both clock changes,
		// plus the instants either side of each local midnight.
		start := time.Date(2026, 1, 1, 0, 0, 0, 0, loc).Add(-time.Hour)
		for ts := start; ts.Before(start.AddDate(1, 0, 1)); ts = ts.Add(7 * time.Minute) {
			check(t, cal, ts, loc)
		}
		for d := start; d.Before(start.AddDate(1, 0, 1)); d = d.AddDate(0, 0, 1) {
			l := d.In(loc)
			midnight := time.Date(l.Year(), l.Month(), l.Day(), 0, 0, 0, 0, loc)
			for _, off := range []time.Duration{-time.Nanosecond, 0, time.Nanosecond} {
				check(t, cal, midnight.Add(off), loc)
			}
		}
	}
}

func check(t *testing.T, cal *Calendar, ts time.Time, loc *time.Location) {
	t.Helper()
	day, month := cal.Keys(ts)
	if want := DayKey(ts, loc); day != want {
		t.Fatalf("%s: %s: day %s, want %s", loc, ts, day, want)
	}
	if want := MonthKey(ts, loc); month != want {
		t.Fatalf("%s: %s: month %s, want %s", loc, ts, month, want)
	}
}

// An older reading (a request that started before midnight) gets its own
// day and does not replace the remembered one.
func TestCalendarOlderReading(t *testing.T) {
	cal := NewCalendar(time.UTC)
	today := time.Date(2026, 11, 30, 0, 0, 1, 0, time.UTC)
	if got := cal.Day(today); got != "2026-11-30" {
		t.Fatalf("day %s", got)
	}
	if got := cal.Day(today.Add(-2 * time.Second)); got != "2026-11-29" {
		t.Fatalf("yesterday's reading: %s", got)
	}
	if d := cal.cur.Load(); d.day != "2026-11-30" {
		t.Fatalf("remembered %s after an older reading, want 2026-11-30", d.day)
	}
	if got := cal.Month(today.AddDate(0, 0, 1)); got != "2026-12" {
		t.Fatalf("month %s", got)
	}
}

func TestCalendarConcurrent(t *testing.T) {
	cal := NewCalendar(mustZone(t, "Europe/Berlin"))
	base := time.Date(2026, 3, 28, 23, 0, 0, 0, cal.Location())
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				ts := base.Add(time.Duration(i*g) * time.Minute)
				if got, want := cal.Day(ts), DayKey(ts, cal.Location()); got != want {
					t.Errorf("%s: %s, want %s", ts, got, want)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func BenchmarkCalendarDay(b *testing.B) {
	cal := NewCalendar(mustZone(b, "Europe/Berlin"))
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		_ = cal.Day(now)
	}
}

func BenchmarkDayKey(b *testing.B) {
	loc := mustZone(b, "Europe/Berlin")
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		_ = DayKey(now, loc)
	}
}

// TestCalendarOffsetChangeInsideTheDay: St John's fell back from 00:01 to
// 23:01 the day before until 2011, so the date went back inside a day. Such
// a day is never remembered, and every reading gets its own date.
func TestCalendarOffsetChangeInsideTheDay(t *testing.T) {
	loc := mustZone(t, "America/St_Johns")
	cal := NewCalendar(loc)
	// 1987-10-25 00:01 NDT became 1987-10-24 23:01 NST.
	start := time.Date(1987, 10, 24, 22, 0, 0, 0, loc)
	for ts := start; ts.Before(start.Add(4 * time.Hour)); ts = ts.Add(time.Minute) {
		check(t, cal, ts, loc)
	}
	// Every zone, every day from 1970 to 2038 at 01:00 and 23:30 UTC.
	for _, zone := range []string{"America/St_Johns", "America/Goose_Bay", "America/Moncton", "Antarctica/Casey", "America/Havana", "Asia/Gaza"} {
		loc := mustZone(t, zone)
		cal := NewCalendar(loc)
		for d := time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC); d.Year() < 2038; d = d.AddDate(0, 0, 1) {
			for _, h := range []time.Duration{time.Hour, 23*time.Hour + 30*time.Minute, 3*time.Hour + 1*time.Minute} {
				check(t, cal, d.Add(h), loc)
			}
		}
	}
}

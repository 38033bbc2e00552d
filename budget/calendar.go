package budget

import (
	"sync/atomic"
	"time"
)

// Calendar names the day and the month holding an instant, in one time
// zone. It remembers the current day, so that the checks on every request
// compare two instants instead of formatting a date (an allocation and a
// time-zone lookup each time). Safe for concurrent use.
type Calendar struct {
	loc *time.Location
	cur atomic.Pointer[calendarDay]
}

// calendarDay is one day in the calendar's zone: [start, end) and its keys.
type calendarDay struct {
	start, end time.Time
	day, month string
}

// NewCalendar returns a calendar for loc.
func NewCalendar(loc *time.Location) *Calendar {
	return &Calendar{loc: loc}
}

// Location is the calendar's time zone.
func (c *Calendar) Location() *time.Location { return c.loc }

// Day names the calendar day holding t, as "2006-01-02".
func (c *Calendar) Day(t time.Time) string { return c.lookup(t).day }

// Month names the calendar month holding t, as "2006-01".
func (c *Calendar) Month(t time.Time) string { return c.lookup(t).month }

// Keys names the day and the month holding t.
func (c *Calendar) Keys(t time.Time) (day, month string) {
	d := c.lookup(t)
	return d.day, d.month
}

func (c *Calendar) lookup(t time.Time) *calendarDay {
	if d := c.cur.Load(); d != nil && !t.Before(d.start) && t.Before(d.end) {
		return d
	}
	d := &calendarDay{day: DayKey(t, c.loc), month: MonthKey(t, c.loc)}
	l := t.In(c.loc)
	d.start = time.Date(l.Year(), l.Month(), l.Day(), 0, 0, 0, 0, c.loc)
	d.end = time.Date(l.Year(), l.Month(), l.Day()+1, 0, 0, 0, 0, c.loc)
	// Remember it only if every instant of [start, end) has this date: both
	// ends belong to the day (a zone whose clocks skip midnight can make
	// time.Date land elsewhere) and the offset does not change inside it
	// (a change there, such as St John's falling back at midnight until
	// 2011, can take the date back within the day). And only if it is newer
	// than the day remembered: a late reading from a request that started
	// before midnight must not push everyone else back a day.
	if !c.uniform(d) {
		return d
	}
	for {
		old := c.cur.Load()
		if old != nil && !d.start.After(old.start) || c.cur.CompareAndSwap(old, d) {
			return d
		}
	}
}

// uniform reports whether every instant of d's [start, end) falls on d.day.
func (c *Calendar) uniform(d *calendarDay) bool {
	if DayKey(d.start, c.loc) != d.day || DayKey(d.end.Add(-time.Nanosecond), c.loc) != d.day {
		return false
	}
	_, offsetEnds := d.start.ZoneBounds()
	return offsetEnds.IsZero() || !offsetEnds.Before(d.end)
}

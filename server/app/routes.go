package app

import (
	"fmt"
	"reflect"
	"slices"
	"time"

	"breakwater/budget"
	"breakwater/limiter"
	"breakwater/server/api"
	"breakwater/server/guard/state"
	"breakwater/server/routes"
)

// State names of a guarded route's memory: its rate windows, its daily
// counts (one state per day) and its fail limit.
func routeWindowsState(name string) string   { return "routes/" + name + "/windows" }
func routeAttemptsPrefix(name string) string { return "routes/" + name + "/attempts/" }
func routeFailsState(name string) string     { return "routes/" + name + "/fails" }
func routeGlobalState(name string) string    { return "routes/" + name + "/fails-global" }

// loadRoutes builds each [[routes]] entry's layers and restores their
// memory from store, so that a restart resets no window or daily count
// and lifts no cooldown.
func loadRoutes(store state.StateLoader, cfgs []routes.Config, loc *time.Location, now time.Time) ([]api.Route, error) {
	out := make([]api.Route, 0, len(cfgs))
	day := budget.DayKey(now, loc)
	for _, c := range cfgs {
		c = c.WithDefaults()
		r := api.Route{Config: c}
		var err error
		if r.Windows, err = limiter.New(c.Limits()); err != nil {
			return nil, fmt.Errorf("routes %q: %w", c.Name, err)
		}
		if err := state.LoadWindows(store, routeWindowsState(c.Name), r.Windows, now); err != nil {
			return nil, err
		}
		counts, err := store.LoadState(routeAttemptsPrefix(c.Name) + day)
		if err != nil {
			return nil, err
		}
		r.Attempts = budget.NewAttempts(loc, day, budget.DecodeCounts(counts))
		if c.Fail != nil {
			if r.Fails, err = limiter.NewFail(c.Fail.Limiter()); err != nil {
				return nil, fmt.Errorf("routes %q: fail: %w", c.Name, err)
			}
			if err := state.LoadFails(store, routeFailsState(c.Name), routeGlobalState(c.Name), r.Fails); err != nil {
				return nil, err
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// routeSnapshots register the routes' memory with the write-behind, unless
// it is shared in the database.
func routeSnapshots(rs []api.Route, shared bool) []state.Snapshot {
	if shared {
		return nil
	}
	var out []state.Snapshot
	for _, r := range rs {
		layer := "route:" + r.Config.Name
		out = append(out,
			state.Windows(routeWindowsState(r.Config.Name), layer, r.Windows),
			state.AttemptsUnder(routeAttemptsPrefix(r.Config.Name), layer, r.Attempts))
		if r.Fails != nil {
			out = append(out, state.Fails(routeFailsState(r.Config.Name), routeGlobalState(r.Config.Name), layer, r.Fails))
		}
	}
	return out
}

// routeFailSnapshots register only the routes' fail limits, for an
// operator command that changes nothing else of them.
func routeFailSnapshots(rs []api.Route) []state.Snapshot {
	var out []state.Snapshot
	for _, r := range rs {
		if r.Fails != nil {
			out = append(out, state.Fails(routeFailsState(r.Config.Name), routeGlobalState(r.Config.Name), "route:"+r.Config.Name, r.Fails))
		}
	}
	return out
}

// routeRestartKeys names what only a restart changes between two
// [[routes]] lists: a route added or removed ("routes.NAME"), or any key
// but its limits ("routes.NAME.upstream"). Rate, window, burst, daily,
// max_body and mode apply live.
func routeRestartKeys(old, next []routes.Config) []string {
	byName := func(cs []routes.Config) map[string]routes.Config {
		m := make(map[string]routes.Config, len(cs))
		for _, c := range cs {
			m[c.Name] = structural(c.WithDefaults())
		}
		return m
	}
	a, b := byName(old), byName(next)
	var keys []string
	for name, c := range a {
		d, ok := b[name]
		switch {
		case !ok:
			keys = append(keys, "routes."+name+" (removed)")
		case !reflect.DeepEqual(c, d):
			va, vb, t := reflect.ValueOf(c), reflect.ValueOf(d), reflect.TypeOf(c)
			for i := range t.NumField() {
				if !reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
					keys = append(keys, "routes."+name+"."+t.Field(i).Tag.Get("koanf"))
				}
			}
		}
	}
	for name := range b {
		if _, ok := a[name]; !ok {
			keys = append(keys, "routes."+name+" (new)")
		}
	}
	slices.Sort(keys)
	return keys
}

// structural is c without the keys that apply live.
func structural(c routes.Config) routes.Config {
	c.Rate, c.Window, c.Burst, c.Daily, c.MaxBody, c.Mode = 0, 0, 0, 0, 0, ""
	return c
}

// keepRouteStructure is next as it runs after a reload: the routes that
// ran, each with next's limits where it has them.
func keepRouteStructure(next, running []routes.Config) []routes.Config {
	limits := make(map[string]routes.Config, len(next))
	for _, c := range next {
		limits[c.Name] = c
	}
	out := make([]routes.Config, len(running))
	for i, c := range running {
		if n, ok := limits[c.Name]; ok {
			c.Rate, c.Window, c.Burst, c.Daily, c.MaxBody, c.Mode = n.Rate, n.Window, n.Burst, n.Daily, n.MaxBody, n.Mode
		}
		out[i] = c
	}
	return out
}

// Package admin is the operator's side of Breakwater's HTTP edge: the
// admin API (the CLI's commands while the server runs: keys, users,
// invites, the brake, cooldowns, backups, recorded events, the ledger),
// the dashboard (dashboard.go, web/), GET /metrics and, with
// server.admin_pprof, Go's profiler. Every route is behind the admin token
// on the admin listener, a loopback address by default; none that
// changes anything acts for a page of another origin.
//
// It runs on the transport of server/edge, which it shares with the
// public API (server/api) and whose counts it shows: the metrics, today's
// refusals. It does not know the public API; the wiring (server/app) puts
// the two side by side.
package admin

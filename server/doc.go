// Package server holds no code: it groups the service's parts, by kind.
//
//   - api: the HTTP edge, where every request enters: the public API, the
//     admin API and dashboard, the transport rules. Echo stays inside it.
//   - app: the wiring; loads config.toml, builds every part, starts and stops them.
//   - cli: the command line (one cobra command per operation), with selftest under it.
//   - guard: the layers between a request and the expensive call, with state
//     (their memory across restarts) and replay (what other limits would have refused).
//   - keys (with userid, the one spelling of a user id), invites, jwtauth,
//     routes: the parts that decide who a request is and what it may do,
//     without HTTP.
//   - operator, failpoint: operations (the operator's commands; the crash points).
//
// docs/DESIGN.md draws the arrows between them.
package server

// Package server holds no code: it groups the service's parts, by kind.
//
//   - edge, api, admin: the HTTP edge, where every request enters, split by
//     audience: edge is the transport both listeners share (connections,
//     client IP, body bounds, request ids, problem+json, the counts of what
//     it answered); api is the public API on it (POST /v1/ocr, invite
//     verification, forward auth and the guarded routes' proxy); admin is
//     the operator's admin API, dashboard and /metrics on it. api and admin
//     import edge and not each other. Echo stays inside these three.
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

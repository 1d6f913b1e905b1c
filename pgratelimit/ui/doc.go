// Package ui is pgratelimit's operator UI: an http.Handler that shows the
// limiters' prefixes, their recorded policies and keys, a key's balance,
// bucket, grants, ledger, request IDs, override, concurrency leases and
// usage alert events, and acts on them: grant, refund, reset, set or clear
// an override, release a lease, redeliver an event.
//
// It has no authentication of its own, as River UI has none: mount it
// behind the app's (a handler that checks the operator's session, an
// admin-only listener, a VPN) and pass the limiters and semaphores the app
// uses, so that every action runs through the library with the app's own
// policies. It reads the database through the library alone (package
// admin and events for what a limiter does not read) and writes nothing
// but what the library's methods write. Its pages are server-rendered
// HTML (html/template) with a stylesheet, all embedded: no CDN, no
// script, no build step.
//
// Every action is a POST form with a per-browser CSRF token (a cookie and a
// hidden field that must match), and cross-origin POSTs are refused
// (http.CrossOriginProtection); with Config.ReadOnly the pages show no
// action and every POST is refused with 403.
//
// See docs/ui.md for the pages, the actions and ways to mount it.
package ui

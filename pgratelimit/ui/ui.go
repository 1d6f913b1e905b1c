package ui

import (
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// The templates and the stylesheet, embedded: the UI works offline, with
// no build step.
//
//go:embed web
var webFiles embed.FS

// Config configures the handler. Pool and at least one limiter or
// semaphore are required.
type Config struct {
	// Pool is the database of the limiters: where the key search and the
	// alert events are read, and events redelivered. Required.
	Pool *pgxpool.Pool

	// Limiters are the app's limiters, one per prefix: the UI shows their
	// prefixes and keys, and grants, refunds and resets through them, with
	// their policies. Defaults to none.
	Limiters []*pgratelimit.Limiter

	// Semaphores are the app's semaphores, one per prefix: the UI lists
	// their keys' leases and releases them through them. Defaults to none.
	Semaphores []*pgratelimit.Semaphore

	// ReadOnly shows the pages with no action, and refuses every POST with
	// 403. Defaults to false.
	ReadOnly bool

	// Prefix is the path the handler is mounted at, such as "/admin": it
	// serves Prefix and the paths under it, without http.StripPrefix (with
	// it, leave Prefix empty). Its links are relative, so they work either
	// way. Defaults to "": the handler serves from "/".
	Prefix string

	// Logger receives a line for each action (Info: what, on which key)
	// and each failure (Error for the database's, Warn for refused
	// requests). Defaults to nil: discard.
	Logger *slog.Logger
}

// csrfCookie is the cookie that holds a browser's CSRF token, and
// csrfField the form field that must repeat it.
const (
	csrfCookie = "pgratelimit_ui_csrf"
	csrfField  = "csrf"
)

// handler is the UI: its configuration, its limiters and semaphores by
// prefix, and its parsed templates.
type handler struct {
	cfg        Config
	log        *slog.Logger
	limiters   map[string]*pgratelimit.Limiter
	semaphores map[string]*pgratelimit.Semaphore
	prefixes   []string // the prefixes of both, sorted
	pages      map[string]*template.Template
	mux        *http.ServeMux
}

// NewHandler validates cfg and returns the UI's handler. Its errors are
// *pgratelimit.ConfigError, naming the field ("Config.Pool").
func NewHandler(cfg Config) (http.Handler, error) {
	h := &handler{cfg: cfg, log: cfg.Logger, limiters: map[string]*pgratelimit.Limiter{},
		semaphores: map[string]*pgratelimit.Semaphore{}}
	if h.log == nil {
		h.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := h.index(); err != nil {
		return nil, err
	}
	h.cfg.Prefix = strings.TrimSuffix(cfg.Prefix, "/")
	if h.cfg.Prefix != "" && !strings.HasPrefix(h.cfg.Prefix, "/") {
		return nil, &pgratelimit.ConfigError{Field: "Config.Prefix", Reason: fmt.Sprintf("must start with /, got %q", cfg.Prefix)}
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	h.pages = pages
	h.routes()
	return http.NewCrossOriginProtection().Handler(h), nil
}

// index checks the pool, the limiters and the semaphores, and indexes them
// by prefix.
func (h *handler) index() error {
	bad := func(field, format string, args ...any) error {
		return &pgratelimit.ConfigError{Field: "Config." + field, Reason: fmt.Sprintf(format, args...)}
	}
	if h.cfg.Pool == nil {
		return bad("Pool", "is nil")
	}
	if len(h.cfg.Limiters)+len(h.cfg.Semaphores) == 0 {
		return bad("Limiters", "is empty, and so is Semaphores: give the UI the app's limiters and semaphores")
	}
	seen := map[string]bool{}
	for i, l := range h.cfg.Limiters {
		if l == nil {
			return bad(fmt.Sprintf("Limiters[%d]", i), "is nil")
		}
		p := l.Config().Prefix
		if h.limiters[p] != nil {
			return bad(fmt.Sprintf("Limiters[%d]", i), "has prefix %q, as another limiter has: give one limiter per prefix", p)
		}
		h.limiters[p] = l
		seen[p] = true
	}
	for i, s := range h.cfg.Semaphores {
		if s == nil {
			return bad(fmt.Sprintf("Semaphores[%d]", i), "is nil")
		}
		p := s.Config().Prefix
		if h.semaphores[p] != nil {
			return bad(fmt.Sprintf("Semaphores[%d]", i), "has prefix %q, as another semaphore has: give one semaphore per prefix", p)
		}
		h.semaphores[p] = s
		seen[p] = true
	}
	for p := range seen {
		h.prefixes = append(h.prefixes, p)
	}
	slices.Sort(h.prefixes)
	return nil
}

// routes registers the pages and, unless ReadOnly, the actions.
func (h *handler) routes() {
	h.mux = http.NewServeMux()
	h.mux.HandleFunc("GET /{$}", h.servePrefixes)
	h.mux.HandleFunc("GET /policies", h.servePolicies)
	h.mux.HandleFunc("GET /keys", h.serveKeys)
	h.mux.HandleFunc("GET /key", h.serveKey)
	static, _ := fs.Sub(webFiles, "web/static")
	h.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	for _, a := range actions() {
		if h.cfg.ReadOnly {
			h.mux.HandleFunc("POST /"+a.name, func(w http.ResponseWriter, r *http.Request) {
				h.log.Warn("pgratelimit ui: an action refused: read-only", "action", a.name)
				http.Error(w, "read-only: this UI takes no action", http.StatusForbidden)
			})
			continue
		}
		h.mux.HandleFunc("POST /"+a.name, func(w http.ResponseWriter, r *http.Request) { h.act(w, r, a) })
	}
}

// ServeHTTP strips Config.Prefix, sets the headers every answer has and
// the browser's CSRF cookie, checks the CSRF token of a POST, and serves
// the page or action.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p := h.cfg.Prefix; p != "" {
		switch {
		case r.URL.Path == p:
			http.Redirect(w, r, p+"/", http.StatusMovedPermanently)
			return
		case !strings.HasPrefix(r.URL.Path, p+"/"):
			http.NotFound(w, r)
			return
		}
		r2 := *r
		u := *r.URL
		u.Path, u.RawPath = strings.TrimPrefix(r.URL.Path, p), ""
		r2.URL = &u
		r = &r2
	}
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cache-Control", "no-store")
	token := h.csrfToken(w, r)
	if r.Method == http.MethodPost && !h.cfg.ReadOnly {
		if err := r.ParseForm(); err != nil || subtle.ConstantTimeCompare([]byte(r.PostForm.Get(csrfField)), []byte(token)) != 1 ||
			!validToken(token) {
			h.log.Warn("pgratelimit ui: an action refused: no CSRF token, or not the browser's", "path", r.URL.Path)
			http.Error(w, "forbidden: the form's CSRF token is missing or is not this browser's: reload the page and try again", http.StatusForbidden)
			return
		}
	}
	h.mux.ServeHTTP(w, r.WithContext(withToken(r.Context(), token)))
}

// csrfToken returns the browser's CSRF token: its cookie's, or for a GET
// without a valid one a new one, set in the cookie. A POST without one
// gets "", which no form field matches.
func (h *handler) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && validToken(c.Value) {
		return c.Value
	}
	if r.Method == http.MethodPost || h.cfg.ReadOnly {
		return ""
	}
	var b [32]byte
	_, _ = rand.Read(b[:])
	token := hex.EncodeToString(b[:])
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: token, Path: h.cfg.Prefix + "/", HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	return token
}

// validToken says whether s is a token csrfToken makes: 64 hex digits.
func validToken(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

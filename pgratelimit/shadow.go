package pgratelimit

import "context"

// shadowKey marks a context made by WithShadow.
type shadowKey struct{}

// WithShadow returns a copy of ctx that marks the checks made with it as
// shadow checks: checks of a limit being rolled out, whose answer the caller
// logs but does not enforce (the Config.Shadow of httplimit, grpclimit and
// connectlimit makes their checks this way). Such checks
// are recorded with the attribute pgratelimit.shadow=true in
// pgratelimit.checks and pgratelimit.check.duration, so a dashboard can tell
// the would-be denials of a shadowed limit from the denials of enforced ones.
// Nothing else changes: the check runs, an allowed check takes its tokens and
// a denied one writes nothing, exactly as without it.
func WithShadow(ctx context.Context) context.Context {
	return context.WithValue(ctx, shadowKey{}, true)
}

// isShadow reports whether ctx was made by WithShadow.
func isShadow(ctx context.Context) bool {
	v, _ := ctx.Value(shadowKey{}).(bool)
	return v
}

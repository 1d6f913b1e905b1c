package httplimit

import (
	"time"

	"github.com/pgratelimit/pgratelimit/internal/middleware"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// The header helpers live in internal/middleware, shared with grpclimit and
// connectlimit; TestHeaderHelpers checks them under their old names here.

func sfString(s string) string          { return middleware.SFString(s) }
func ceilSeconds(d time.Duration) int64 { return middleware.CeilSeconds(d) }
func window(cfg pgratelimit.Config, now time.Time) int64 {
	return middleware.Window(cfg, pgratelimit.Result{}, now)
}

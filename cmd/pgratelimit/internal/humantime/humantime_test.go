package humantime

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Duration: under a minute as Go prints it, else the two largest units; always
// rounded up.
func TestDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                      "0s",
		-time.Second:                           "0s",
		412 * time.Millisecond:                 "412ms",
		4306200 * time.Microsecond:             "4.307s",
		20 * time.Second:                       "20s",
		19*time.Second + time.Millisecond:      "20s",
		59*time.Second + 500*time.Millisecond:  "1m",
		time.Minute:                            "1m",
		12*time.Minute + 4100*time.Millisecond: "12m 5s",
		3*time.Hour + 12*time.Minute:           "3h 12m",
		3 * time.Hour:                          "3h",
		3*time.Hour + time.Second:              "3h 1m",
		23*time.Hour + 59*time.Minute + 30*time.Second:  "1d",
		5*Day + 14*time.Hour:                            "5d 14h",
		134*time.Hour + 48*time.Minute + 31*time.Second: "5d 15h",
		time.Duration(math.MaxInt64):                    "106751d 23h",
	} {
		require.Equal(t, want, Duration(d), "%s", d)
	}
}

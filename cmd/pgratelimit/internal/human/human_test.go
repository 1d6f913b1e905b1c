package human

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

// In gives the moment too from a day up, in now's zone, to the minute
// (rounded up).
func TestIn(t *testing.T) {
	now := time.Date(2026, 11, 25, 9, 55, 30, 0, time.UTC)
	require.Equal(t, "in 4.307s", In(4307*time.Millisecond, now))
	require.Equal(t, "in 23h 59m", In(23*time.Hour+58*time.Minute+1*time.Second, now))
	require.Equal(t, "in 5d 14h (2026-11-30 23:26 UTC)", In(5*Day+13*time.Hour+30*time.Minute, now))
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	require.Equal(t, "in 1d 12h (2026-11-26 22:56 CET)", In(36*time.Hour, now.In(berlin)))
}

func TestPercentAndPlural(t *testing.T) {
	require.Equal(t, "57%", Percent(0.57))
	require.Equal(t, "80%", Percent(0.8))
	require.Equal(t, "1 token", Plural(1, "token", "tokens"))
	require.Equal(t, "-1 token", Plural(-1, "token", "tokens"))
	require.Equal(t, "0 tokens", Plural(0, "token", "tokens"))
}

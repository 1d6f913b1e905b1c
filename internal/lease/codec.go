package lease

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// A key's leases column is a JSON array of its leases (json, which
// PostgreSQL keeps as written): [{"id":"…","weight":1,"token":7,
// "acquired_at":"…","expires_at":"…","ttl":30000000000}], the times in
// RFC 3339, the TTL in nanoseconds. Encode
// writes exactly that, and Decode reads it without encoding/json (a
// lease operation reads and writes a key's leases every time); anything
// else, such as what migration 00009 wrote, goes through encoding/json.

// Encode is the leases column of a key with leases ls: a JSON array of
// them, "" (NULL) when there are none.
func Encode(ls []Lease) string {
	if len(ls) == 0 {
		return ""
	}
	var buf [256]byte // one lease or two: the string is the only allocation
	b := buf[:0]
	if n := 160 * len(ls); n > len(buf) {
		b = make([]byte, 0, n)
	}
	b = append(b, '[')
	for i, l := range ls {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = appendString(b, l.ID)
		b = append(b, `,"weight":`...)
		b = strconv.AppendInt(b, l.Weight, 10)
		b = append(b, `,"token":`...)
		b = strconv.AppendInt(b, l.Token, 10)
		b = append(b, `,"acquired_at":"`...)
		b = l.AcquiredAt.AppendFormat(b, time.RFC3339Nano)
		b = append(b, `","expires_at":"`...)
		b = l.ExpiresAt.AppendFormat(b, time.RFC3339Nano)
		b = append(b, `","ttl":`...)
		b = strconv.AppendInt(b, int64(l.TTL), 10)
		b = append(b, '}')
	}
	return string(append(b, ']'))
}

// appendString appends s as a JSON string (invalid UTF-8 as U+FFFD, as
// encoding/json does).
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+n]...)
		}
		i += n
	}
	return append(b, '"')
}

// Decode reads a leases column ("": none).
func Decode(col string) ([]Lease, error) {
	if col == "" {
		return nil, nil
	}
	if ls, ok := decodeOwn(col); ok {
		return ls, nil
	}
	var ls []Lease
	if err := json.Unmarshal([]byte(col), &ls); err != nil {
		return nil, fmt.Errorf("pgratelimit: a key's leases column is not an array of leases: %w", err)
	}
	return ls, nil
}

// decodeOwn reads a column as Encode writes it, and says whether it was.
func decodeOwn(s string) ([]Lease, bool) {
	s, ok := strings.CutPrefix(s, "[")
	if !ok {
		return nil, false
	}
	var ls []Lease
	for {
		var l Lease
		if s, ok = strings.CutPrefix(s, `{"id":"`); !ok {
			return nil, false
		}
		if l.ID, s, ok = plainString(s); !ok {
			return nil, false
		}
		if s, ok = strings.CutPrefix(s, `,"weight":`); !ok {
			return nil, false
		}
		if l.Weight, s, ok = integer(s); !ok {
			return nil, false
		}
		if s, ok = strings.CutPrefix(s, `,"token":`); !ok {
			return nil, false
		}
		if l.Token, s, ok = integer(s); !ok {
			return nil, false
		}
		if s, ok = strings.CutPrefix(s, `,"acquired_at":"`); !ok {
			return nil, false
		}
		if l.AcquiredAt, s, ok = timeString(s); !ok {
			return nil, false
		}
		if s, ok = strings.CutPrefix(s, `,"expires_at":"`); !ok {
			return nil, false
		}
		if l.ExpiresAt, s, ok = timeString(s); !ok {
			return nil, false
		}
		if s, ok = strings.CutPrefix(s, `,"ttl":`); !ok {
			return nil, false
		}
		var ttl int64
		if ttl, s, ok = integer(s); !ok {
			return nil, false
		}
		l.TTL = time.Duration(ttl)
		if s, ok = strings.CutPrefix(s, "}"); !ok {
			return nil, false
		}
		ls = append(ls, l)
		if s == "]" {
			return ls, true
		}
		if s, ok = strings.CutPrefix(s, ","); !ok {
			return nil, false
		}
	}
}

// plainString reads the rest of a JSON string without escapes, up to and
// past its closing quote.
func plainString(s string) (string, string, bool) {
	i := strings.IndexByte(s, '"')
	if i < 0 || strings.IndexByte(s[:i], '\\') >= 0 || !utf8.ValidString(s[:i]) {
		return "", s, false
	}
	return s[:i], s[i+1:], true
}

// integer reads a JSON integer.
func integer(s string) (int64, string, bool) {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	for i < len(s) && '0' <= s[i] && s[i] <= '9' {
		i++
	}
	n, err := strconv.ParseInt(s[:i], 10, 64)
	return n, s[i:], err == nil
}

// timeString reads the rest of a JSON string holding an RFC 3339 time.
func timeString(s string) (time.Time, string, bool) {
	v, rest, ok := plainString(s)
	if !ok {
		return time.Time{}, s, false
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	return t, rest, err == nil
}

package engine

import (
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// The array parameters of the array statements. Where pgx knows a
// parameter's type (its statement cache, the default) it sends them in
// binary, so the server does not parse them; each element goes to pgx
// through a pointer into the slice (pgtype.ArrayGetter), so encoding boxes
// none (pgx's own slices box every element). Where it does not (exec mode,
// the simple protocol) it sends the array literal of TextValue.

// texts is a text[] parameter.
type texts []string

func (a texts) Dimensions() []pgtype.ArrayDimension { return dimensions(len(a)) }
func (a texts) Index(i int) any                     { return (*textElem)(&a[i]) }
func (a texts) IndexType() any                      { return (*textElem)(nil) }
func (a texts) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: sqlgen.TextArray(len(a), func(i int) string { return a[i] }), Valid: true}, nil
}

type textElem string

func (e *textElem) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: string(*e), Valid: true}, nil
}

// int64s is a bigint[] parameter.
type int64s []int64

func (a int64s) Dimensions() []pgtype.ArrayDimension { return dimensions(len(a)) }
func (a int64s) Index(i int) any                     { return (*int64Elem)(&a[i]) }
func (a int64s) IndexType() any                      { return (*int64Elem)(nil) }
func (a int64s) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: sqlgen.Int64Array(len(a), func(i int) int64 { return a[i] }), Valid: true}, nil
}

type int64Elem int64

func (e *int64Elem) Int64Value() (pgtype.Int8, error) {
	return pgtype.Int8{Int64: int64(*e), Valid: true}, nil
}

// times is a timestamptz[] parameter.
type times []time.Time

func (a times) Dimensions() []pgtype.ArrayDimension { return dimensions(len(a)) }
func (a times) Index(i int) any                     { return (*timeElem)(&a[i]) }
func (a times) IndexType() any                      { return (*timeElem)(nil) }
func (a times) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: sqlgen.TimeArray(len(a), func(i int) time.Time { return a[i] }), Valid: true}, nil
}

type timeElem time.Time

func (e *timeElem) TimestamptzValue() (pgtype.Timestamptz, error) {
	return pgtype.Timestamptz{Time: time.Time(*e), Valid: true}, nil
}

// durations is an interval[] parameter, each of microseconds alone (as
// sqlgen.Interval writes them).
type durations []time.Duration

func (a durations) Dimensions() []pgtype.ArrayDimension { return dimensions(len(a)) }
func (a durations) Index(i int) any                     { return (*durationElem)(&a[i]) }
func (a durations) IndexType() any                      { return (*durationElem)(nil) }
func (a durations) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: sqlgen.TextArray(len(a), func(i int) string { return sqlgen.Interval(a[i]) }), Valid: true}, nil
}

type durationElem time.Duration

func (e *durationElem) IntervalValue() (pgtype.Interval, error) {
	return pgtype.Interval{Microseconds: time.Duration(*e).Microseconds(), Valid: true}, nil
}

// tids is a tid[] parameter: the ctids of locked rows.
type tids []pgtype.TID

func (a tids) Dimensions() []pgtype.ArrayDimension { return dimensions(len(a)) }
func (a tids) Index(i int) any                     { return (*tidElem)(&a[i]) }
func (a tids) IndexType() any                      { return (*tidElem)(nil) }
func (a tids) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: sqlgen.TextArray(len(a), func(i int) string {
		return "(" + strconv.FormatUint(uint64(a[i].BlockNumber), 10) + "," + strconv.FormatUint(uint64(a[i].OffsetNumber), 10) + ")"
	}), Valid: true}, nil
}

type tidElem pgtype.TID

func (e *tidElem) TIDValue() (pgtype.TID, error) { return pgtype.TID(*e), nil }

func dimensions(n int) []pgtype.ArrayDimension {
	return []pgtype.ArrayDimension{{Length: int32(n), LowerBound: 1}}
}

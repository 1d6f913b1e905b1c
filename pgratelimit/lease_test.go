package pgratelimit

import (
	"strconv"
	"testing"
)

// knownRows remembers at most maxKnownRows keys, then starts again.
func TestKnownRowsBounded(t *testing.T) {
	var k knownRows
	for i := range maxKnownRows {
		k.add(strconv.Itoa(i))
	}
	if !k.has("0") || !k.has(strconv.Itoa(maxKnownRows-1)) || k.has("other") {
		t.Fatal("a key added is not remembered, or one never added is")
	}
	k.add("other")
	if n := len(k.keys); k.has("0") || !k.has("other") || n != 1 {
		t.Fatalf("past %d keys: %d remembered, want only the newest", maxKnownRows, n)
	}
}

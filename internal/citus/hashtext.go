package citus

import "math/bits"

// hashText is PostgreSQL's hashtext(text) for a deterministic collation
// (such as "C", the collation of the key column): the 32-bit hash that Citus
// computes of a text distribution column to find the shard whose
// [shardminvalue, shardmaxvalue] range holds it.
//
// For a deterministic collation hashtext (src/backend/utils/adt/varlena.c)
// is hash_any(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key)): Bob Jenkins'
// lookup3 hash_bytes (src/common/hashfn.c) of the string's bytes, returned
// as int4 (the uint32 reinterpreted as signed). hash_bytes reads aligned
// input a native word at a time, so its result depends on the server's byte
// order; this is the little-endian result (x86-64, arm64), where the aligned
// and unaligned paths agree. This port is the unaligned little-endian path,
// statement for statement.
func hashText(k string) int32 {
	n := uint32(len(k))
	a := 0x9e3779b9 + n + 3923095
	b, c := a, a

	// Most of the key, 12 bytes at a time.
	for len(k) >= 12 {
		a += le32(k[0:])
		b += le32(k[4:])
		c += le32(k[8:])
		a, b, c = hashMix(a, b, c)
		k = k[12:]
	}

	// The last 0..11 bytes; the lowest byte of c is reserved for the
	// length, so its bytes are shifted up by 8.
	switch len(k) {
	case 11:
		c += uint32(k[10]) << 24
		fallthrough
	case 10:
		c += uint32(k[9]) << 16
		fallthrough
	case 9:
		c += uint32(k[8]) << 8
		fallthrough
	case 8:
		b += uint32(k[7]) << 24
		fallthrough
	case 7:
		b += uint32(k[6]) << 16
		fallthrough
	case 6:
		b += uint32(k[5]) << 8
		fallthrough
	case 5:
		b += uint32(k[4])
		fallthrough
	case 4:
		a += uint32(k[3]) << 24
		fallthrough
	case 3:
		a += uint32(k[2]) << 16
		fallthrough
	case 2:
		a += uint32(k[1]) << 8
		fallthrough
	case 1:
		a += uint32(k[0])
	}

	return int32(hashFinal(a, b, c))
}

// le32 reads a little-endian uint32 from the first 4 bytes of s.
func le32(s string) uint32 {
	return uint32(s[0]) | uint32(s[1])<<8 | uint32(s[2])<<16 | uint32(s[3])<<24
}

// hashMix is hashfn.c's mix(a, b, c).
func hashMix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= c
	a ^= bits.RotateLeft32(c, 4)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 6)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 8)
	b += a
	a -= c
	a ^= bits.RotateLeft32(c, 16)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 19)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 4)
	b += a
	return a, b, c
}

// hashFinal is hashfn.c's final(a, b, c), returning c.
func hashFinal(a, b, c uint32) uint32 {
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return c
}

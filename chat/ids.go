package chat

import (
	"crypto/rand"
	"encoding/binary"
	"time"
)

// Id prefixes of the protocol.
const (
	PrefixThread     = "thr_"
	PrefixRun        = "run_"
	PrefixMessage    = "msg_"
	PrefixCheckpoint = "cp_"
	PrefixOperation  = "op_"
)

const crockford = "0123456789abcdefghjkmnpqrstvwxyz"

// NewID returns prefix followed by 26 base32 characters: 48 bits of Unix
// milliseconds then 80 random bits, so ids sort by creation time. Safe for
// concurrent use.
func NewID(prefix string) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(time.Now().UnixMilli())<<16)
	if _, err := rand.Read(b[6:]); err != nil {
		panic("chat: crypto/rand failed: " + err.Error())
	}
	// 128 bits -> 26 base32 digits (the first carries 3 bits).
	hi := binary.BigEndian.Uint64(b[:8])
	lo := binary.BigEndian.Uint64(b[8:])
	out := make([]byte, len(prefix)+26)
	copy(out, prefix)
	for i := len(out) - 1; i >= len(prefix); i-- {
		out[i] = crockford[lo&31]
		lo = lo>>5 | hi<<59
		hi >>= 5
	}
	return string(out)
}

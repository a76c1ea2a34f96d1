package chat

import (
	"crypto/rand"
	"encoding/binary"
	"sync"
	"time"
)

// Id prefixes of the protocol.
const (
	PrefixThread     = "thr_"
	PrefixRun        = "run_"
	PrefixMessage    = "msg_"
	PrefixCheckpoint = "cp_"
	PrefixOperation  = "op_"
	PrefixUser       = "usr_"
	PrefixToken      = "tok_"
)

const crockford = "0123456789abcdefghjkmnpqrstvwxyz"

// idState makes ids of one process strictly increasing: within one
// millisecond the random part of the previous id is incremented.
var idState struct {
	sync.Mutex
	ms     uint64
	hi, lo uint64 // the 80 random bits: 16 in hi, 64 in lo
}

// NewID returns prefix followed by 26 base32 characters: 48 bits of Unix
// milliseconds then 80 random bits, so ids sort by creation time (strictly,
// within one process). Safe for concurrent use.
func NewID(prefix string) string {
	now := uint64(time.Now().UnixMilli())
	idState.Lock()
	if now > idState.ms {
		var b [10]byte
		if _, err := rand.Read(b[:]); err != nil {
			panic("chat: crypto/rand failed: " + err.Error())
		}
		idState.ms = now
		idState.hi = uint64(binary.BigEndian.Uint16(b[:2]))
		idState.lo = binary.BigEndian.Uint64(b[2:])
	} else {
		idState.lo++
		if idState.lo == 0 {
			idState.hi = (idState.hi + 1) & 0xffff
		}
	}
	ms, hi, lo := idState.ms, idState.hi, idState.lo
	idState.Unlock()

	// 128 bits: ms (48) | hi (16) | lo (64) -> 26 base32 digits.
	top := ms<<16 | hi
	out := make([]byte, len(prefix)+26)
	copy(out, prefix)
	for i := len(out) - 1; i >= len(prefix); i-- {
		out[i] = crockford[lo&31]
		lo = lo>>5 | top<<59
		top >>= 5
	}
	return string(out)
}

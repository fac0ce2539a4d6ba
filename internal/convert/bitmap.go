package convert

import (
	"math/bits"
	"sync/atomic"
)

// bitmap holds one bit per output cluster. set and has are safe for
// concurrent use: in a one-pass conversion, readers set bits of later
// batches while the writer reads bits of earlier ones, and two batches may
// share a word.
type bitmap []uint64

func newBitmap(n int64) bitmap { return make(bitmap, (n+63)/64) }

func (b bitmap) set(i int64) { atomic.OrUint64(&b[i/64], 1<<(i%64)) }

func (b bitmap) has(i int64) bool {
	return i/64 < int64(len(b)) && atomic.LoadUint64(&b[i/64])&(1<<(i%64)) != 0
}

// anyIn reports whether a bit in [first, first+n) is set.
func (b bitmap) anyIn(first, n int64) bool {
	for i := first; i < first+n && i/64 < int64(len(b)); {
		if i%64 == 0 && i+64 <= first+n {
			if b[i/64] != 0 {
				return true
			}
			i += 64
			continue
		}
		if b.has(i) {
			return true
		}
		i++
	}
	return false
}

// count returns the number of set bits.
func (b bitmap) count() int64 {
	var n int64
	for _, w := range b {
		n += int64(bits.OnesCount64(w))
	}
	return n
}

//go:build isal && cgo

package containerdisk

/*
#cgo LDFLAGS: -lisal
#include <stdlib.h>
#include <string.h>
#include <isa-l/igzip_lib.h>

static struct inflate_state *gunzip_new(void) {
	struct inflate_state *s = malloc(sizeof(struct inflate_state));
	if (s) {
		isal_inflate_init(s);
		s->crc_flag = ISAL_GZIP;
	}
	return s;
}

static void gunzip_reset(struct inflate_state *s) {
	isal_inflate_reset(s);
	s->crc_flag = ISAL_GZIP;
}

// gunzip_step inflates from in to out; *in_used and *out_used say how much
// of each it took, *finished whether the member's trailer was read and
// matched. The state keeps no pointer to either buffer once it returns.
static int gunzip_step(struct inflate_state *s, unsigned char *in, unsigned int in_len,
		unsigned char *out, unsigned int out_len,
		unsigned int *in_used, unsigned int *out_used, int *finished) {
	s->next_in = in;
	s->avail_in = in_len;
	s->next_out = out;
	s->avail_out = out_len;
	int ret = isal_inflate(s);
	*in_used = in_len - s->avail_in;
	*out_used = out_len - s->avail_out;
	*finished = s->block_state == ISAL_BLOCK_FINISH;
	s->next_in = NULL;
	s->next_out = NULL;
	// ISA-L's AVX code may leave the upper halves of the YMM registers
	// dirty; Go's SSE code (SHA-256 among it) then runs many times slower
	// on this thread.
	if (__builtin_cpu_supports("avx")) {
		__asm__ volatile("vzeroupper");
	}
	return ret;
}
*/
import "C"

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"unsafe"
)

// newGzipReader reads a gzip stream of one or more members with ISA-L's
// inflate, several times faster than Go's. The members' headers are
// parsed here with the rules of Go's gzip reader (which CDI's importer
// uses), so both accept the same headers; ISA-L inflates the deflate data
// and checks each member's CRC and size.
func newGzipReader(r *bufio.Reader) (io.ReadCloser, error) {
	z := &isalGunzip{r: r, members: 1}
	if err := checkGzipHeader(r); err != nil {
		return nil, err
	}
	z.st = C.gunzip_new()
	if z.st == nil {
		return nil, errors.New("gzip: out of memory")
	}
	return z, nil
}

type isalGunzip struct {
	r       *bufio.Reader
	st      *C.struct_inflate_state
	out     []byte // what ISA-L inflates into: it is slow with small outputs
	pending []byte // out's bytes not read yet
	err     error
	members int // members begun
}

func (z *isalGunzip) memberCount() int { return z.members }

// gunzipOutSize is the output ISA-L is given at a time.
const gunzipOutSize = 1 << 20

func (z *isalGunzip) Read(p []byte) (int, error) {
	if len(z.pending) == 0 && z.err == nil && len(p) > 0 {
		if z.out == nil {
			z.out = make([]byte, gunzipOutSize)
		}
		n, err := z.inflate(z.out)
		z.pending, z.err = z.out[:n], err
	}
	if len(z.pending) > 0 {
		n := copy(p, z.pending)
		z.pending = z.pending[n:]
		return n, nil
	}
	if len(p) == 0 {
		return 0, nil
	}
	return 0, z.err
}

// inflate fills p with at least a byte, or returns an error: io.EOF
// after the last member.
func (z *isalGunzip) inflate(p []byte) (int, error) {
	want := 1 // input bytes to have at hand before the next call
	var ferr error
	for ferr == nil {
		// At the end of the input ISA-L is called with what is left, then
		// with nothing, until it stops making progress.
		_, err := z.r.Peek(min(max(z.r.Buffered(), want), z.r.Size()))
		if err != nil && err != io.EOF && err != bufio.ErrBufferFull {
			return 0, err
		}
		in, _ := z.r.Peek(z.r.Buffered())
		var inUsed, outUsed C.uint
		var finished C.int
		var inPtr *C.uchar
		if len(in) > 0 {
			inPtr = (*C.uchar)(unsafe.Pointer(&in[0]))
		}
		ret := C.gunzip_step(z.st, inPtr, C.uint(len(in)),
			(*C.uchar)(unsafe.Pointer(&p[0])), C.uint(len(p)), &inUsed, &outUsed, &finished)
		z.r.Discard(int(inUsed))
		switch {
		case ret < 0:
			ferr = fmt.Errorf("gzip: invalid compressed data (ISA-L error %d)", int(ret))
		case finished != 0:
			// The member ended and its trailer matched: another follows,
			// or the stream ends.
			C.gunzip_reset(z.st)
			if ferr = checkGzipHeader(z.r); ferr == nil {
				z.members++
			}
		case outUsed > 0 || inUsed > 0:
			want = 1
		case err == io.EOF || len(in) == z.r.Size():
			ferr = io.ErrUnexpectedEOF // no progress, and no more input to give
		default:
			want = len(in) + 1 // no progress: give it more input
		}
		if outUsed > 0 {
			return int(outUsed), ferr
		}
	}
	return 0, ferr
}

func (z *isalGunzip) Close() error {
	if z.st != nil {
		C.free(unsafe.Pointer(z.st))
		z.st = nil
	}
	if z.err == nil {
		z.err = errors.New("gzip: reader closed")
	}
	return nil
}

// gzip header flags (RFC 1952, section 2.3.1).
const (
	gzipFlagHCRC    = 1 << 1
	gzipFlagName    = 1 << 3
	gzipFlagComment = 1 << 4
)

// errGzipMember is a member header Go's gzip reader refuses.
var errGzipMember = errors.New("gzip: invalid header")

// readGzipHeader reads one member's header as Go's gzip reader does: io.EOF
// when the stream ends before it (none follows), the same refusals
// (magic, method, a name or comment of 512 bytes or more, a wrong header
// CRC, reserved flags), and the same reading of FEXTRA (a 16-bit length).
func readGzipHeader(r *bufio.Reader) error {
	var buf [10]byte
	if _, err := io.ReadFull(r, buf[:]); err != nil {
		return err
	}
	if buf[0] != 0x1f || buf[1] != 0x8b || buf[2] != 8 {
		return errGzipMember
	}
	flg := buf[3]
	sum := crc32.ChecksumIEEE(buf[:])
	if flg&gzipFlagExtra != 0 {
		var n [2]byte
		if _, err := io.ReadFull(r, n[:]); err != nil {
			return noEOF(err)
		}
		extra := make([]byte, int(n[0])|int(n[1])<<8)
		if _, err := io.ReadFull(r, extra); err != nil {
			return noEOF(err)
		}
		sum = crc32.Update(crc32.Update(sum, crc32.IEEETable, n[:]), crc32.IEEETable, extra)
	}
	for _, f := range []byte{gzipFlagName, gzipFlagComment} {
		if flg&f == 0 {
			continue
		}
		s, err := r.ReadSlice(0)
		if len(s) > 512 || err == bufio.ErrBufferFull {
			return errGzipMember
		}
		if err != nil {
			return err // as Go's, an EOF inside a name is io.EOF
		}
		sum = crc32.Update(sum, crc32.IEEETable, s)
	}
	if flg&gzipFlagHCRC != 0 {
		var c [2]byte
		if _, err := io.ReadFull(r, c[:]); err != nil {
			return noEOF(err)
		}
		if uint16(c[0])|uint16(c[1])<<8 != uint16(sum) {
			return errGzipMember
		}
	}
	if flg>>5 != 0 {
		return errGzipMember
	}
	return nil
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// checkGzipHeader checks the next member's header with readGzipHeader
// without consuming it, since ISA-L parses it again: io.EOF when no member
// follows, and the error Go's reader gives for a header that the stream's
// end cuts short.
func checkGzipHeader(r *bufio.Reader) error {
	for n := 64; ; n *= 2 {
		b, ended := r.Peek(min(n, r.Size()))
		err := readGzipHeader(bufio.NewReader(bytes.NewReader(b)))
		if err != io.EOF && err != io.ErrUnexpectedEOF || ended != nil {
			return err
		}
		if len(b) == r.Size() {
			return errGzipMember // longer than any header Go's reader takes
		}
	}
}

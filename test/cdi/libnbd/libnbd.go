// Package libnbd stands in for the libnbd Go bindings, which the Go module
// proxy does not serve. CDI uses them only for its VDDK source; every call
// fails.
package libnbd

import "errors"

var errStub = errors.New("libnbd is not available in this build")

const (
	CMD_FLAG_REQ_ONE = 1 << 3
	STATE_HOLE       = 1 << 0
	STATE_ZERO       = 1 << 1
)

type LibnbdError struct{ Op, Errmsg string }

func (e *LibnbdError) Error() string { return e.Op + ": " + e.Errmsg }

type ExtentCallback func(metacontext string, offset uint64, entries []uint32, err *int) int

type BlockStatusOptargs struct {
	Flags    uint32
	FlagsSet bool
}

type PreadOptargs struct{}

type Libnbd struct{}

func Create() (*Libnbd, error) { return nil, errStub }

func (*Libnbd) AddMetaContext(string) error { return errStub }
func (*Libnbd) ConnectUri(string) error     { return errStub }
func (*Libnbd) GetSize() (uint64, error)    { return 0, errStub }
func (*Libnbd) Pread([]byte, uint64, *PreadOptargs) error {
	return errStub
}
func (*Libnbd) BlockStatus(uint64, uint64, ExtentCallback, *BlockStatusOptargs) error {
	return errStub
}
func (*Libnbd) Close() *LibnbdError { return nil }

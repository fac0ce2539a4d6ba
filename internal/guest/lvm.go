package guest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// Limits of the LVM2 reader; docs/security.md lists them.
const (
	// maxLVMMetadata bounds the text metadata read (lvm2's default
	// metadata area is 1 MiB; a volume group of a hundred volumes
	// describes itself in a few KiB).
	maxLVMMetadata = 1 << 20
	// maxLVMDepth bounds the nesting of its sections, maxLVMValues the
	// values and sections it holds in all.
	maxLVMDepth  = 8
	maxLVMValues = 1 << 16
	// maxLogicalVolumes bounds the volumes read from one volume group,
	// maxLVSegments the segments of one volume.
	maxLogicalVolumes = 64
	maxLVSegments     = 256
)

// LogicalVolume is a linear LVM2 logical volume on one physical volume,
// readable as a disk region of Size bytes.
type LogicalVolume struct {
	// Name is "vg/lv".
	Name string
	Size int64
	r    io.ReaderAt
	// segs map the volume's bytes onto the disk, in order.
	segs []lvSegment
}

type lvSegment struct{ lvOff, diskOff, size int64 }

// ReadAt reads the volume's bytes from the disk, through its segments.
func (lv *LogicalVolume) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off >= lv.Size {
		return 0, io.EOF
	}
	n := 0
	for n < len(p) && off+int64(n) < lv.Size {
		o := off + int64(n)
		i, _ := slices.BinarySearchFunc(lv.segs, o, func(s lvSegment, o int64) int {
			switch {
			case s.lvOff+s.size <= o:
				return -1
			case s.lvOff > o:
				return 1
			}
			return 0
		})
		s := lv.segs[i]
		k := int(min(int64(len(p)-n), s.lvOff+s.size-o))
		m, err := lv.r.ReadAt(p[n:n+k], s.diskOff+o-s.lvOff)
		n += m
		if err != nil {
			return n, err
		}
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// ReadLVM reads the LVM2 physical volume at [off, off+size) of r: its
// label, its first metadata area's current text metadata, and the
// logical volumes it describes. Volumes it cannot map (striped, mirrored,
// thin, on other physical volumes) are named in notes, not returned.
func ReadLVM(r io.ReaderAt, off, size int64) ([]*LogicalVolume, []string, error) {
	head := make([]byte, 4*sectorSize)
	if err := readFull(r, head, off); err != nil {
		return nil, nil, err
	}
	var label []byte
	for s := range 4 {
		if l := head[s*sectorSize:]; string(l[:8]) == "LABELONE" && string(l[24:32]) == "LVM2 001" {
			label = l[:sectorSize]
			break
		}
	}
	if label == nil {
		return nil, nil, errors.New("lvm: no physical volume label")
	}
	le := binary.LittleEndian
	ph := int(le.Uint32(label[20:]))
	if ph < 32 || ph+32+8 > sectorSize {
		return nil, nil, fmt.Errorf("lvm: a label header at %d", ph)
	}
	pvUUID := string(label[ph : ph+32])
	// The data areas, then the metadata areas, each list ending in a zero
	// entry.
	var mdas [][2]int64
	o, list := ph+40, 0
	for list < 2 {
		if o+16 > sectorSize {
			return nil, nil, errors.New("lvm: the area lists run past the label")
		}
		a, n := int64(le.Uint64(label[o:])), int64(le.Uint64(label[o+8:]))
		o += 16
		if a == 0 {
			list++
			continue
		}
		if list == 1 {
			mdas = append(mdas, [2]int64{a, n})
		}
	}
	if len(mdas) == 0 {
		return nil, nil, errors.New("lvm: no metadata area")
	}
	text, err := readMetadataArea(r, off, size, mdas[0][0], mdas[0][1])
	if err != nil {
		return nil, nil, err
	}
	vg, err := parseLVMText(text)
	if err != nil {
		return nil, nil, err
	}
	return mapVolumes(r, off, size, vg, pvUUID)
}

// readMetadataArea reads the current metadata text from the metadata
// area at [at, at+n) of the physical volume: its header names where the
// text lies in the area's ring buffer (which may wrap past its end).
func readMetadataArea(r io.ReaderAt, pvOff, pvSize, at, n int64) ([]byte, error) {
	if at < 0 || n < 1024 || at > pvSize || n > pvSize-at {
		return nil, fmt.Errorf("lvm: a metadata area of %d bytes at %d", n, at)
	}
	h := make([]byte, sectorSize)
	if err := readFull(r, h, pvOff+at); err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	if string(h[4:20]) != " LVM2 x[5A%r0N*>" {
		return nil, errors.New("lvm: no metadata area header")
	}
	// raw_locn: offset (from the area's start), size, checksum, flags.
	tOff, tSize := int64(le.Uint64(h[40:])), int64(le.Uint64(h[48:]))
	if tSize == 0 {
		return nil, errors.New("lvm: no metadata in the area")
	}
	if tSize > maxLVMMetadata || tOff < sectorSize || tOff >= n || tSize > n-sectorSize {
		return nil, fmt.Errorf("lvm: metadata of %d bytes at %d in an area of %d", tSize, tOff, n)
	}
	text := make([]byte, tSize)
	first := min(tSize, n-tOff)
	if err := readFull(r, text[:first], pvOff+at+tOff); err != nil {
		return nil, err
	}
	if first < tSize { // wrapped: the rest follows the area's header
		if err := readFull(r, text[first:], pvOff+at+sectorSize); err != nil {
			return nil, err
		}
	}
	return bytes.TrimRight(text, "\x00"), nil
}

// lvmSection is a section of LVM2's text metadata: its values (a string,
// an int64 or a list of them) and its subsections, in order.
type lvmSection struct {
	name     string
	values   map[string]any
	sections []*lvmSection
}

func (s *lvmSection) sub(name string) *lvmSection {
	for _, c := range s.sections {
		if c.name == name {
			return c
		}
	}
	return nil
}

func (s *lvmSection) str(k string) string { v, _ := s.values[k].(string); return v }
func (s *lvmSection) num(k string) int64  { v, _ := s.values[k].(int64); return v }
func (s *lvmSection) list(k string) []any { v, _ := s.values[k].([]any); return v }
func (s *lvmSection) strs(k string) []string {
	var out []string
	for _, v := range s.list(k) {
		if str, ok := v.(string); ok {
			out = append(out, str)
		}
	}
	return out
}

// parseLVMText parses LVM2's text metadata format (config-file syntax:
// name = value, name { ... }, values quoted strings, integers or
// [lists], # comments) and returns the volume group's section, the one
// section at the top level.
func parseLVMText(b []byte) (*lvmSection, error) {
	p := &lvmParser{b: b}
	top := &lvmSection{values: map[string]any{}}
	if err := p.body(top, 0); err != nil {
		return nil, fmt.Errorf("lvm metadata: %w", err)
	}
	if len(top.sections) != 1 {
		return nil, fmt.Errorf("lvm metadata: %d volume groups", len(top.sections))
	}
	return top.sections[0], nil
}

type lvmParser struct {
	b      []byte
	i      int
	values int
}

func (p *lvmParser) skip() {
	for p.i < len(p.b) {
		switch c := p.b[p.i]; {
		case c == '#':
			for p.i < len(p.b) && p.b[p.i] != '\n' {
				p.i++
			}
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			p.i++
		default:
			return
		}
	}
}

func isLVMName(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("_.+-", c) >= 0
}

// body reads name = value and name { ... } until its closing brace (or
// the end, at depth 0).
func (p *lvmParser) body(s *lvmSection, depth int) error {
	if depth > maxLVMDepth {
		return fmt.Errorf("sections nested deeper than %d", maxLVMDepth)
	}
	for {
		p.skip()
		if p.i == len(p.b) {
			if depth > 0 {
				return errors.New("a section without its closing brace")
			}
			return nil
		}
		if p.b[p.i] == '}' {
			if depth == 0 {
				return errors.New("a closing brace without its section")
			}
			p.i++
			return nil
		}
		start := p.i
		for p.i < len(p.b) && isLVMName(p.b[p.i]) {
			p.i++
		}
		name := string(p.b[start:p.i])
		if name == "" {
			return fmt.Errorf("unexpected %q at %d", p.b[p.i], p.i)
		}
		if p.values++; p.values > maxLVMValues {
			return fmt.Errorf("more than %d values", maxLVMValues)
		}
		p.skip()
		if p.i == len(p.b) {
			return errors.New("a name without a value")
		}
		switch p.b[p.i] {
		case '{':
			p.i++
			c := &lvmSection{name: name, values: map[string]any{}}
			s.sections = append(s.sections, c)
			if err := p.body(c, depth+1); err != nil {
				return err
			}
		case '=':
			p.i++
			p.skip()
			v, err := p.value(true)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			s.values[name] = v
		default:
			return fmt.Errorf("unexpected %q after %s", p.b[p.i], name)
		}
	}
}

// value reads a string, an integer, or (when lists are allowed) a list
// of strings and integers.
func (p *lvmParser) value(lists bool) (any, error) {
	if p.i == len(p.b) {
		return nil, errors.New("no value")
	}
	switch c := p.b[p.i]; {
	case c == '"':
		var sb strings.Builder
		for p.i++; p.i < len(p.b); p.i++ {
			switch p.b[p.i] {
			case '"':
				p.i++
				return sb.String(), nil
			case '\\':
				if p.i++; p.i == len(p.b) {
					return nil, errors.New("an unterminated string")
				}
			}
			sb.WriteByte(p.b[p.i])
		}
		return nil, errors.New("an unterminated string")
	case c == '[' && lists:
		var l []any
		for p.i++; ; {
			p.skip()
			if p.i == len(p.b) {
				return nil, errors.New("an unterminated list")
			}
			if p.b[p.i] == ']' {
				p.i++
				return l, nil
			}
			if p.values++; p.values > maxLVMValues {
				return nil, fmt.Errorf("more than %d values", maxLVMValues)
			}
			v, err := p.value(false)
			if err != nil {
				return nil, err
			}
			l = append(l, v)
			p.skip()
			if p.i < len(p.b) && p.b[p.i] == ',' {
				p.i++
			}
		}
	case c == '-' || c >= '0' && c <= '9':
		start := p.i
		for p.i++; p.i < len(p.b) && (p.b[p.i] >= '0' && p.b[p.i] <= '9' || p.b[p.i] == '.'); p.i++ {
		}
		n, err := strconv.ParseInt(string(p.b[start:p.i]), 10, 64)
		if err != nil {
			return float64(0), nil // a float (lvm writes none we read)
		}
		return n, nil
	}
	return nil, fmt.Errorf("unexpected %q at %d", p.b[p.i], p.i)
}

// mapVolumes maps the volume group's linear logical volumes onto the
// physical volume it was read from (pvUUID, its 32 characters without
// dashes).
func mapVolumes(r io.ReaderAt, off, size int64, vg *lvmSection, pvUUID string) ([]*LogicalVolume, []string, error) {
	extent := vg.num("extent_size") * sectorSize
	if extent <= 0 || extent > 1<<40 {
		return nil, nil, fmt.Errorf("lvm: volume group %s: extent size %d", vg.name, extent)
	}
	pvs := vg.sub("physical_volumes")
	if pvs == nil {
		return nil, nil, fmt.Errorf("lvm: volume group %s has no physical volumes", vg.name)
	}
	var pvName string
	var peStart int64
	for _, pv := range pvs.sections {
		if strings.ReplaceAll(pv.str("id"), "-", "") == pvUUID {
			pvName, peStart = pv.name, pv.num("pe_start")*sectorSize
		}
	}
	if pvName == "" {
		return nil, nil, fmt.Errorf("lvm: volume group %s does not list this physical volume", vg.name)
	}
	if peStart < 0 || peStart > size {
		return nil, nil, fmt.Errorf("lvm: extents start at %d, past the physical volume", peStart)
	}
	var out []*LogicalVolume
	var notes []string
	lvs := vg.sub("logical_volumes")
	if lvs == nil {
		return nil, nil, nil
	}
	for i, lv := range lvs.sections {
		name := vg.name + "/" + lv.name
		if i == maxLogicalVolumes {
			notes = append(notes, fmt.Sprintf("lvm: %d more logical volumes of %s not read", len(lvs.sections)-i, vg.name))
			break
		}
		v, why := mapVolume(r, off, size, lv, pvName, peStart, extent)
		if why != "" {
			notes = append(notes, fmt.Sprintf("lvm: %s not read: %s", name, why))
			continue
		}
		v.Name = name
		out = append(out, v)
	}
	return out, notes, nil
}

// mapVolume maps one logical volume's segments, or says why it cannot.
func mapVolume(r io.ReaderAt, off, size int64, lv *lvmSection, pvName string, peStart, extent int64) (*LogicalVolume, string) {
	if !slices.Contains(lv.strs("status"), "VISIBLE") {
		return nil, "not a visible volume (a thin pool's or a mirror's part)"
	}
	if len(lv.sections) > maxLVSegments {
		return nil, fmt.Sprintf("more than %d segments", maxLVSegments)
	}
	v := &LogicalVolume{r: r}
	next := int64(0)
	for _, seg := range lv.sections {
		if !strings.HasPrefix(seg.name, "segment") {
			continue
		}
		if t := seg.str("type"); t != "striped" || seg.num("stripe_count") != 1 {
			return nil, fmt.Sprintf("a %s segment of %d stripes (only linear volumes are read)", t, seg.num("stripe_count"))
		}
		stripes := seg.list("stripes")
		if len(stripes) != 2 {
			return nil, "a segment without its physical volume"
		}
		pv, _ := stripes[0].(string)
		pe, _ := stripes[1].(int64)
		if pv != pvName {
			return nil, "a segment on another physical volume"
		}
		start, count := seg.num("start_extent"), seg.num("extent_count")
		if start != next || count <= 0 || count > size/extent || pe < 0 || pe > size/extent {
			return nil, fmt.Sprintf("a segment of %d extents at %d (pe %d)", count, start, pe)
		}
		diskOff := peStart + pe*extent
		if diskOff+count*extent > size {
			return nil, "a segment past the physical volume's end"
		}
		v.segs = append(v.segs, lvSegment{lvOff: start * extent, diskOff: off + diskOff, size: count * extent})
		next = start + count
	}
	if len(v.segs) == 0 {
		return nil, "no segments"
	}
	v.Size = next * extent
	return v, ""
}

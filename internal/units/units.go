// Package units reads the sizes and shares people write in flags and
// config files: "2GiB", "512M", "100000", "5%". One parser, so that every
// flag that takes a size accepts the same spellings and says the same
// thing about a bad one.
package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// suffixes are the units a size may end in, longest first. Decimal
// spellings (GB, G) mean the binary unit too, as df and the kernel do.
var suffixes = []struct {
	s string
	m int64
}{
	{"TIB", 1 << 40}, {"GIB", 1 << 30}, {"MIB", 1 << 20}, {"KIB", 1 << 10},
	{"TB", 1 << 40}, {"GB", 1 << 30}, {"MB", 1 << 20}, {"KB", 1 << 10},
	{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1},
}

// maxSize bounds a size: larger ones are surely typos, and half of int64
// leaves room to add two of them.
const maxSize = math.MaxInt64 / 2

// ParseSize reads a byte count: "123", "64MiB", "2GiB", "512M", "1.5g",
// "10k" (any case, blanks around). Zero is a size; a negative, NaN or
// absurdly large one is an error of the form `"x" is not a size such as
// 64MiB or 2GiB`. Callers that want a positive size check for 0.
func ParseSize(s string) (int64, error) {
	n, ok := parseSize(s)
	if !ok {
		return 0, fmt.Errorf("%q is not a size such as 64MiB or 2GiB", s)
	}
	return n, nil
}

func parseSize(s string) (int64, bool) {
	t := strings.ToUpper(strings.TrimSpace(s))
	mult := int64(1)
	for _, u := range suffixes {
		if rest, ok := strings.CutSuffix(t, u.s); ok {
			t, mult = strings.TrimSpace(rest), u.m
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v < 0 || math.IsNaN(v) || v*float64(mult) > maxSize {
		return 0, false
	}
	return int64(v * float64(mult)), true
}

// SizeOrPercent is a size, or a share of some whole that the caller knows
// (a file system's size, the machine's memory). At most one is set.
type SizeOrPercent struct {
	Bytes   int64
	Percent float64 // 0 to 100
}

// Of is the bytes it stands for out of a whole of total bytes.
func (v SizeOrPercent) Of(total int64) int64 {
	if v.Percent > 0 {
		return int64(float64(total) * v.Percent / 100)
	}
	return v.Bytes
}

// String writes it back in a form ParseSizeOrPercent reads.
func (v SizeOrPercent) String() string {
	if v.Percent > 0 {
		return strconv.FormatFloat(v.Percent, 'f', -1, 64) + "%"
	}
	return strconv.FormatInt(v.Bytes, 10)
}

// ParseSizeOrPercent reads a size as ParseSize does, or a percentage
// between 0% and 100% ("5%", "0.5%"). The errors name the input:
// `"150%": a percentage must be between 0% and 100%`, or
// `"x": want a size such as 2GiB or a percentage such as 5%`.
func ParseSizeOrPercent(s string) (SizeOrPercent, error) {
	if p, ok := strings.CutSuffix(strings.TrimSpace(s), "%"); ok {
		v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || v < 0 || v > 100 || math.IsNaN(v) {
			return SizeOrPercent{}, fmt.Errorf("%q: a percentage must be between 0%% and 100%%", s)
		}
		return SizeOrPercent{Percent: v}, nil
	}
	n, ok := parseSize(s)
	if !ok {
		return SizeOrPercent{}, fmt.Errorf("%q: want a size such as 2GiB or a percentage such as 5%%", s)
	}
	return SizeOrPercent{Bytes: n}, nil
}

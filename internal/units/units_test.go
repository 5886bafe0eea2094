package units

import (
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"64MiB": 64 << 20, "2GiB": 2 << 30, "1g": 1 << 30, "100": 100, "1.5M": 3 << 19,
		" 10k ": 10 << 10, "0": 0, "3 TB": 3 << 40, "7b": 7, "512kib": 512 << 10,
	} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "x", "-1M", "1Q", "NaN", "5%", "9999999T", "GiB"} {
		_, err := ParseSize(bad)
		if err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
			continue
		}
		if !strings.Contains(err.Error(), "is not a size such as 64MiB") || !strings.Contains(err.Error(), "\""+bad+"\"") {
			t.Errorf("ParseSize(%q): %v", bad, err)
		}
	}
}

func TestParseSizeOrPercent(t *testing.T) {
	for in, want := range map[string]SizeOrPercent{
		"5%": {Percent: 5}, "0.5%": {Percent: 0.5}, " 100 %": {Percent: 100}, "0": {},
		"2GiB": {Bytes: 2 << 30}, "512M": {Bytes: 512 << 20}, "100000": {Bytes: 100000},
	} {
		got, err := ParseSizeOrPercent(in)
		if err != nil || got != want {
			t.Errorf("ParseSizeOrPercent(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for in, msg := range map[string]string{
		"101%": "a percentage must be between 0% and 100%", "-3%": "a percentage must be between 0% and 100%",
		"5%%": "a percentage must be between", "x%": "a percentage must be between",
		"": "want a size such as 2GiB or a percentage such as 5%", "x": "want a size", "-1": "want a size", "1Q": "want a size",
	} {
		_, err := ParseSizeOrPercent(in)
		if err == nil || !strings.Contains(err.Error(), msg) || !strings.HasPrefix(err.Error(), "\""+in+"\": ") {
			t.Errorf("ParseSizeOrPercent(%q): %v; want %q", in, err, msg)
		}
	}
}

func TestOfAndString(t *testing.T) {
	if got := (SizeOrPercent{Percent: 5}).Of(1000); got != 50 {
		t.Errorf("5%% of 1000 = %d", got)
	}
	if got := (SizeOrPercent{Bytes: 7}).Of(1000); got != 7 {
		t.Errorf("7 bytes of 1000 = %d", got)
	}
	for _, in := range []string{"5%", "0.25%", "4096", "0"} {
		v, err := ParseSizeOrPercent(in)
		if err != nil || v.String() != in {
			t.Errorf("%q read back as %q (%v)", in, v.String(), err)
		}
	}
}

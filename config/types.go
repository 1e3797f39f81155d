package config

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a time.Duration written as Go duration text with an extra
// "d" unit for days: "250ms", "1m30s", "72h", "3d", "1d12h".
type Duration time.Duration

// Duration returns the value as a time.Duration.
func (d Duration) Duration() time.Duration { return time.Duration(d) }

// String formats the duration, using days where they divide evenly.
func (d Duration) String() string {
	td := time.Duration(d)
	if td > 0 && td%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(td/(24*time.Hour)), 10) + "d"
	}
	return td.String()
}

// maxDays keeps durations inside time.Duration (about 292 years).
const maxDays = 106751

// goDurationRe is the syntax of time.ParseDuration, which reports a value
// beyond time.Duration with the same error as bad text.
var goDurationRe = regexp.MustCompile(`^[-+]?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$`)

// ParseDuration parses Go duration text with an optional leading day part.
// A value beyond time.Duration is an error that says so, however it is
// written.
func ParseDuration(text string) (time.Duration, error) {
	bad := fmt.Errorf("invalid duration %q (use e.g. 500ms, 30s, 5m, 72h, 3d)", text)
	tooLong := fmt.Errorf("duration %q is too long (at most %dd, about 292 years)", text, maxDays)
	s := strings.TrimSpace(text)
	if s == "0" {
		return 0, nil
	}
	var days time.Duration
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.ParseInt(s[:i], 10, 64)
		if errors.Is(err, strconv.ErrRange) && n > 0 {
			return 0, tooLong
		}
		if err != nil || n < 0 {
			return 0, bad
		}
		if n > maxDays {
			return 0, tooLong
		}
		days = time.Duration(n) * 24 * time.Hour
		s = s[i+1:]
		if s == "" {
			return days, nil
		}
		if s[0] == '-' || s[0] == '+' {
			return 0, bad
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil && goDurationRe.MatchString(s) {
		return 0, tooLong
	}
	if err != nil {
		return 0, bad
	}
	if days > 0 && d > time.Duration(math.MaxInt64)-days {
		return 0, tooLong
	}
	return days + d, nil
}

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return located(n, "expected a duration such as 30s, 5m or 3d")
	}
	v, err := ParseDuration(n.Value)
	if err != nil {
		return located(n, "%v", err)
	}
	*d = Duration(v)
	return nil
}

// ByteSize is a size in bytes written as an integer or with a unit:
// "512KiB", "16MiB", "1GiB", "10MB".
type ByteSize int64

var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000},
	{"B", 1},
}

// ParseByteSize parses a size with an optional unit.
func ParseByteSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	for _, u := range byteUnits {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
			if err != nil || n < 0 {
				break
			}
			if n > math.MaxInt64/u.mult {
				return 0, fmt.Errorf("size %q is too large", s)
			}
			return n * u.mult, nil
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("invalid size %q (use e.g. 1048576, 512KiB, 16MiB)", s)
	}
	return n, nil
}

// UnmarshalYAML implements yaml.Unmarshaler.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return located(n, "expected a size such as 16MiB")
	}
	v, err := ParseByteSize(n.Value)
	if err != nil {
		return located(n, "%v", err)
	}
	*b = ByteSize(v)
	return nil
}

// Int is an integer setting. Unlike a plain Go int it refuses fractions,
// which yaml.v3 would silently truncate.
type Int int

// UnmarshalYAML implements yaml.Unmarshaler.
func (i *Int) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		return located(n, "expected an integer, got %s", describeNode(n))
	}
	var v int64
	if err := n.Decode(&v); err != nil || v > math.MaxInt32 || v < math.MinInt32 {
		return located(n, "integer %s is out of range", n.Value)
	}
	*i = Int(v)
	return nil
}

func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return describeTag(strings.TrimPrefix(n.ShortTag(), "!!")) + " " + strconv.Quote(n.Value)
}

// located returns an error that yaml.v3 collects with the others instead of
// aborting the decode, carrying the node's line.
func located(n *yaml.Node, format string, args ...any) error {
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: column %d: %s", n.Line, n.Column, fmt.Sprintf(format, args...))}}
}

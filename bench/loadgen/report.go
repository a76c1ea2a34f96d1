package loadgen

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// Report is everything one invocation measured.
type Report struct {
	Command         string           `json:"command"`
	Date            string           `json:"date"`
	Machine         Machine          `json:"machine"`
	Config          map[string]any   `json:"config"`
	Scenarios       []ScenarioReport `json:"scenarios"`
	ProtocolErrors  int              `json:"protocol_errors"`
	ChecksOK        bool             `json:"checks_ok"`
	DurationSeconds float64          `json:"duration_seconds"`
}

// ScenarioReport is one scenario: its figures, for the gateway and (for
// fan-out figures) the floor, with its errors and the database check.
type ScenarioReport struct {
	Name          string       `json:"name"`
	Shape         string       `json:"shape"`
	Seconds       float64      `json:"seconds"`
	Metrics       []Metric     `json:"metrics"`
	GatewayErrors []ErrorCount `json:"gateway_errors"`
	FloorErrors   []ErrorCount `json:"floor_errors,omitempty"`
	Check         *Check       `json:"gateway_check,omitempty"`
	ServerLog     LogCounts    `json:"gateway_log"`
	Failure       string       `json:"failure,omitempty"`
	Skipped       string       `json:"skipped,omitempty"` // why the scenario did not run
	Notes         []string     `json:"notes,omitempty"`
}

// LogCounts counts the gateway's log lines at level WARN and ERROR.
type LogCounts struct {
	Errors   int `json:"errors"`
	Warnings int `json:"warnings"`
}

// Metric is one figure. Floor and Ratio (gateway / floor) are set for the
// figures the floor also has.
type Metric struct {
	Name    string   `json:"name"`
	Unit    string   `json:"unit"`
	Gateway *float64 `json:"gateway"`
	Floor   *float64 `json:"floor,omitempty"`
	Ratio   *float64 `json:"ratio_to_floor,omitempty"`
	Target  string   `json:"target,omitempty"`
}

func val(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

// metric builds a figure of the gateway alone.
func metric(name, unit string, gw float64, target string) Metric {
	return Metric{Name: name, Unit: unit, Gateway: val(gw), Target: target}
}

// compared builds a figure with the floor's and their ratio.
func compared(name, unit string, gw, floor float64, target string) Metric {
	m := Metric{Name: name, Unit: unit, Gateway: val(gw), Floor: val(floor), Target: target}
	if m.Gateway != nil && m.Floor != nil && floor != 0 {
		m.Ratio = val(gw / floor)
	}
	return m
}

// formatNumber prints v with precision that suits its size and thin
// thousands separators.
func formatNumber(v *float64) string {
	if v == nil {
		return "—"
	}
	x := *v
	switch a := math.Abs(x); {
	case a >= 1000:
		return groupThousands(fmt.Sprintf("%.0f", x))
	case a >= 100:
		return fmt.Sprintf("%.0f", x)
	case a >= 10:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.2f", x)
	}
}

func groupThousands(s string) string {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func formatRatio(v *float64) string {
	if v == nil {
		return ""
	}
	return fmt.Sprintf("%.2f×", *v)
}

// WriteTable prints the report as readable tables, one per scenario.
func WriteTable(w io.Writer, r *Report) error {
	var b strings.Builder
	fmt.Fprintf(
		&b,
		"gateway benchmark — %s — %d CPUs (%s), %s\n",
		r.Date, r.Machine.CPUs, r.Machine.Model, r.Machine.GoVersion,
	)
	for _, s := range r.Scenarios {
		if s.Skipped != "" {
			fmt.Fprintf(&b, "\n== %s: skipped: %s\n", s.Name, s.Skipped)
			continue
		}
		fmt.Fprintf(&b, "\n== %s: %s (%.1fs)\n", s.Name, s.Shape, s.Seconds)
		if s.Failure != "" {
			fmt.Fprintf(&b, "   FAILED: %s\n", s.Failure)
		}
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "   metric\tgateway\tfloor\tratio\ttarget\n")
		for _, m := range s.Metrics {
			floor := ""
			if m.Floor != nil {
				floor = formatNumber(m.Floor)
			}
			fmt.Fprintf(
				tw,
				"   %s (%s)\t%s\t%s\t%s\t%s\n",
				m.Name, m.Unit, formatNumber(m.Gateway), floor, formatRatio(m.Ratio), m.Target,
			)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(&b, "   errors: gateway %s", formatErrors(s.GatewayErrors))
		if s.FloorErrors != nil {
			fmt.Fprintf(&b, "; floor %s", formatErrors(s.FloorErrors))
		}
		b.WriteString("\n")
		if s.Check != nil {
			state := "ok"
			if !s.Check.OK {
				state = "FAILED: " + s.Check.Output
			}
			fmt.Fprintf(&b, "   gateway check: %s\n", state)
		}
		fmt.Fprintf(&b, "   gateway log: %d errors, %d warnings\n", s.ServerLog.Errors, s.ServerLog.Warnings)
		for _, n := range s.Notes {
			fmt.Fprintf(&b, "   note: %s\n", n)
		}
	}
	verdict := "ok"
	if r.ProtocolErrors > 0 || !r.ChecksOK {
		verdict = "FAILED"
	}
	fmt.Fprintf(
		&b,
		"\n%s: %d protocol errors, checks ok: %v, %.0fs in all\n",
		verdict, r.ProtocolErrors, r.ChecksOK, r.DurationSeconds,
	)
	_, err := io.WriteString(w, b.String())
	return err
}

func formatErrors(list []ErrorCount) string {
	if len(list) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(list))
	for _, e := range list {
		p := fmt.Sprintf("%s×%d", e.Kind, e.Count)
		if len(e.Examples) > 0 {
			p += " (e.g. " + e.Examples[0] + ")"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ")
}

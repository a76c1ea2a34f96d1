package apptest

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics is one parsed /metrics answer (Families) and its text (Raw).
type Metrics struct {
	Families map[string]*dto.MetricFamily
	Raw      string
}

var scrapeClient = &http.Client{Timeout: 15 * time.Second}

// Scrape GETs url, requires a 200 in the text exposition format, and
// parses it.
func Scrape(t testing.TB, url string) Metrics {
	t.Helper()
	resp, err := scrapeClient.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("GET %s: %s %q, want 200 text/plain", url, resp.Status, resp.Header.Get("Content-Type"))
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(raw)))
	if err != nil {
		t.Fatalf("GET %s: not the exposition format: %v", url, err)
	}
	return Metrics{Families: families, Raw: string(raw)}
}

// Get sums the series of name whose labels include want (name, value,
// name, value…): the value of a counter or gauge, the sample count of a
// histogram. A family that is missing fails the test.
func (m Metrics) Get(t testing.TB, name string, want ...string) float64 {
	t.Helper()
	v, ok := m.Value(t, name, want...)
	if !ok {
		t.Fatalf("no metric %s in the scrape", name)
	}
	return v
}

// Value is Get, reporting a missing family (a vector with no series yet)
// instead of failing.
func (m Metrics) Value(t testing.TB, name string, want ...string) (float64, bool) {
	t.Helper()
	f, ok := m.Families[name]
	if !ok {
		return 0, false
	}
	sum := 0.0
	for _, s := range f.GetMetric() {
		if !HasLabels(s, want) {
			continue
		}
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			sum += s.GetCounter().GetValue()
		case dto.MetricType_GAUGE:
			sum += s.GetGauge().GetValue()
		case dto.MetricType_HISTOGRAM:
			sum += float64(s.GetHistogram().GetSampleCount())
		default:
			t.Fatalf("metric %s has type %s", name, f.GetType())
		}
	}
	return sum, true
}

// HasLabels reports whether s has every name=value pair of want.
func HasLabels(s *dto.Metric, want []string) bool {
	for i := 0; i+1 < len(want); i += 2 {
		found := false
		for _, l := range s.GetLabel() {
			if l.GetName() == want[i] && l.GetValue() == want[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

package main

// Reading /metrics of the binary, for the scenarios across processes
// (main_freeze_test.go, main_multinode_test.go). The metrics' own tests are
// in-process: app/scenario_metrics_test.go.

import (
	"io"
	"net/http"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrapeResult is one parsed /metrics answer and its text.
type scrapeResult struct {
	families map[string]*dto.MetricFamily
	raw      string
}

// scrape GETs url and parses the exposition format.
func scrape(t *testing.T, url string) scrapeResult {
	t.Helper()
	resp, err := httpClient.Get(url)
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
	return scrapeResult{families: families, raw: string(raw)}
}

// get sums the series of name whose labels include want: the value of a
// counter or gauge, the sample count of a histogram. A family that is
// missing fails the test.
func (s scrapeResult) get(t *testing.T, name string, want ...string) float64 {
	t.Helper()
	v, ok := s.value(t, name, want...)
	if !ok {
		t.Fatalf("no metric %s in the scrape", name)
	}
	return v
}

// value is get, reporting a missing family (a vector with no series yet)
// instead of failing.
func (s scrapeResult) value(t *testing.T, name string, want ...string) (float64, bool) {
	t.Helper()
	f, ok := s.families[name]
	if !ok {
		return 0, false
	}
	sum := 0.0
	for _, m := range f.GetMetric() {
		if !hasLabels(m, want) {
			continue
		}
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			sum += m.GetCounter().GetValue()
		case dto.MetricType_GAUGE:
			sum += m.GetGauge().GetValue()
		case dto.MetricType_HISTOGRAM:
			sum += float64(m.GetHistogram().GetSampleCount())
		default:
			t.Fatalf("metric %s has type %s", name, f.GetType())
		}
	}
	return sum, true
}

// hasLabels reports whether m has every name=value pair of want.
func hasLabels(m *dto.Metric, want []string) bool {
	for i := 0; i+1 < len(want); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
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

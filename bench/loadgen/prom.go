package loadgen

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// promSample maps a series, written as the text format writes it
// ("name{label="value",...}", a histogram's buckets with their le label
// last), to its value.
type promSample map[string]float64

// parseProm reads Prometheus's text exposition format with the
// prometheus/common parser and flattens every sample to its series.
func parseProm(r io.Reader) (promSample, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	out := promSample{}
	for name, mf := range families {
		for _, m := range mf.GetMetric() {
			labels := m.GetLabel()
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[series(name, labels)] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[series(name, labels)] = m.GetGauge().GetValue()
			case dto.MetricType_UNTYPED:
				out[series(name, labels)] = m.GetUntyped().GetValue()
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				// The +Inf bucket is the count (the parser may or may not
				// keep its line as a bucket).
				out[series(name+"_bucket", labels, "le", "+Inf")] = float64(h.GetSampleCount())
				for _, b := range h.GetBucket() {
					out[series(name+"_bucket", labels, "le", formatBound(b.GetUpperBound()))] = float64(
						b.GetCumulativeCount(),
					)
				}
				out[series(name+"_count", labels)] = float64(h.GetSampleCount())
				out[series(name+"_sum", labels)] = h.GetSampleSum()
			case dto.MetricType_SUMMARY:
				sm := m.GetSummary()
				for _, q := range sm.GetQuantile() {
					out[series(name, labels, "quantile", formatBound(q.GetQuantile()))] = q.GetValue()
				}
				out[series(name+"_count", labels)] = float64(sm.GetSampleCount())
				out[series(name+"_sum", labels)] = sm.GetSampleSum()
			}
		}
	}
	return out, nil
}

// series writes a sample's name and labels (then extra, name and value
// pairs) as the text format does.
func series(name string, labels []*dto.LabelPair, extra ...string) string {
	if len(labels) == 0 && len(extra) == 0 {
		return name
	}
	var b strings.Builder
	b.WriteString(name)
	b.WriteByte('{')
	pair := func(k, v string) {
		if b.Len() > len(name)+1 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteString(`="`)
		b.WriteString(labelEscaper.Replace(v))
		b.WriteByte('"')
	}
	for _, l := range labels {
		pair(l.GetName(), l.GetValue())
	}
	for i := 0; i+1 < len(extra); i += 2 {
		pair(extra[i], extra[i+1])
	}
	b.WriteByte('}')
	return b.String()
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// formatBound writes a bucket bound or quantile as the text format does.
func formatBound(v float64) string {
	if math.IsInf(v, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// scrape reads a /metrics page.
func scrape(ctx context.Context, url string) (promSample, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return parseProm(resp.Body)
}

// promWindow is the change of the server's metrics over one window.
type promWindow struct {
	before, after promSample
	seconds       float64
}

// has reports whether the window has both scrapes and the series.
func (w *promWindow) has(series string) bool {
	if w == nil || w.before == nil || w.after == nil {
		return false
	}
	_, ok := w.after[series]
	return ok
}

// delta is how much a counter (or a histogram's _count or _sum) grew; NaN
// when it is missing.
func (w *promWindow) delta(series string) float64 {
	if !w.has(series) {
		return math.NaN()
	}
	return w.after[series] - w.before[series]
}

func (w *promWindow) rate(series string) float64 { return w.delta(series) / w.seconds }

// promBucket is one cumulative histogram bucket's growth over a window.
type promBucket struct{ le, n float64 }

// buckets returns the growth of histogram name's buckets (series carrying
// labels, e.g. `kind="write"`, or "") over the window, by bound; nil
// without observations.
func (w *promWindow) buckets(name, labels string) []promBucket {
	if w == nil || w.before == nil || w.after == nil {
		return nil
	}
	var buckets []promBucket
	prefix := name + "_bucket{"
	for series, after := range w.after {
		if !strings.HasPrefix(series, prefix) || (labels != "" && !strings.Contains(series, labels)) {
			continue
		}
		i := strings.Index(series, `le="`)
		if i < 0 {
			continue
		}
		le := series[i+4:]
		le = le[:strings.IndexByte(le, '"')]
		v := math.Inf(1)
		if le != "+Inf" {
			var err error
			if v, err = strconv.ParseFloat(le, 64); err != nil {
				continue
			}
		}
		buckets = append(buckets, promBucket{v, after - w.before[series]})
	}
	if len(buckets) == 0 {
		return nil
	}
	sort.Slice(buckets, func(i, j int) bool { return buckets[i].le < buckets[j].le })
	if buckets[len(buckets)-1].n <= 0 {
		return nil
	}
	return buckets
}

// quantileBound returns the upper bound (le) of the histogram bucket that
// holds quantile q of the observations made in the window, for the
// histogram name whose series carry labels (e.g. `kind="write"`, or ""):
// the true quantile is at most that. NaN without observations.
func (w *promWindow) quantileBound(name, labels string, q float64) float64 {
	buckets := w.buckets(name, labels)
	if buckets == nil {
		return math.NaN()
	}
	total := buckets[len(buckets)-1].n
	for _, b := range buckets {
		if b.n >= q*total {
			return b.le
		}
	}
	return math.Inf(1)
}

// quantile estimates quantile q as Prometheus's histogram_quantile does:
// linearly within the bucket that holds it (from 0 for the first bucket).
// It assumes the observations spread evenly over the bucket, so it is an
// estimate, never outside the bucket's bounds. +Inf when q falls in the
// +Inf bucket, NaN without observations.
func (w *promWindow) quantile(name, labels string, q float64) float64 {
	buckets := w.buckets(name, labels)
	if buckets == nil {
		return math.NaN()
	}
	rank := q * buckets[len(buckets)-1].n
	lower, below := 0.0, 0.0
	for _, b := range buckets {
		if b.n >= rank {
			if math.IsInf(b.le, 1) {
				return b.le
			}
			if b.n == below {
				return b.le
			}
			return lower + (b.le-lower)*(rank-below)/(b.n-below)
		}
		lower, below = b.le, b.n
	}
	return math.Inf(1)
}

// sum adds up every series of the metric name (whatever its labels): a
// gauge's value over its series; ok false when it has none.
func (s promSample) sum(name string) (v float64, ok bool) {
	for series, x := range s {
		if series == name || strings.HasPrefix(series, name+"{") {
			v, ok = v+x, true
		}
	}
	return v, ok
}

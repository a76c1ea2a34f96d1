package loadgen

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// promSample maps a series ("name{labels}" as exposed) to its value.
type promSample map[string]float64

// parseProm reads Prometheus's text exposition format: one "series value"
// per line, comments skipped. Series keep their labels verbatim.
func parseProm(r io.Reader) (promSample, error) {
	out := promSample{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		// "name{labels} value [timestamp]" or "name value [timestamp]";
		// label values may hold spaces, never an unescaped '}'.
		var series, rest string
		if end := strings.LastIndexByte(line, '}'); end >= 0 && strings.IndexByte(line, '{') >= 0 {
			series, rest = line[:end+1], line[end+1:]
		} else if name, after, ok := strings.Cut(line, " "); ok {
			series, rest = name, after
		} else {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		out[series] = v
	}
	return out, sc.Err()
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

// quantileBound returns the upper bound (le) of the histogram bucket that
// holds quantile q of the observations made in the window, for the
// histogram name whose series carry labels (e.g. `kind="write"`, or ""):
// the true quantile is at most that. NaN without observations.
func (w *promWindow) quantileBound(name, labels string, q float64) float64 {
	if w == nil || w.before == nil || w.after == nil {
		return math.NaN()
	}
	type bucket struct{ le, n float64 }
	var buckets []bucket
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
		buckets = append(buckets, bucket{v, after - w.before[series]})
	}
	if len(buckets) == 0 {
		return math.NaN()
	}
	sort.Slice(buckets, func(i, j int) bool { return buckets[i].le < buckets[j].le })
	total := buckets[len(buckets)-1].n
	if total <= 0 {
		return math.NaN()
	}
	for _, b := range buckets {
		if b.n >= q*total {
			return b.le
		}
	}
	return math.Inf(1)
}

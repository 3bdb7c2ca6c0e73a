package lazyfs

import (
	"sort"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dsec-dev/dsec/internal/blob"
)

// Stats are the counters of one layer, or summed over an image's layers.
type Stats struct {
	// ImageBytes is the sum of regular file sizes.
	ImageBytes int64
	// FetchedBytes is the (uncompressed) size of the chunks fetched from
	// the blob store, prefetch included.
	FetchedBytes int64
	// PrefetchedBytes is the part of FetchedBytes fetched by prefetch.
	PrefetchedBytes int64
	// TransferredBytes is what those fetches read from the blob store:
	// the chunks as stored, zstd-compressed where that saved space.
	TransferredBytes int64
	// ReadBytes were served to the kernel by the daemon; page cache hits and
	// passthrough reads never reach the daemon.
	ReadBytes int64
	// Hits and Misses count chunk lookups by reads.
	Hits, Misses uint64
	// FetchWait is the total time reads spent waiting for fetches.
	FetchWait time.Duration
	// FetchErrors counts fetches that failed after all retries or were
	// corrupt.
	FetchErrors uint64
	// MetadataRequests counts the FUSE requests other than reads that
	// reached the daemon: lookups, attributes, directory listings, opens
	// and closes, symlinks, xattrs. What the kernel answers from its
	// caches never reaches it.
	MetadataRequests uint64
}

// HitRatio is Hits/(Hits+Misses), or 0 with no lookups.
func (s Stats) HitRatio() float64 {
	if s.Hits+s.Misses == 0 {
		return 0
	}
	return float64(s.Hits) / float64(s.Hits+s.Misses)
}

func (s *Stats) add(o Stats) {
	s.ImageBytes += o.ImageBytes
	s.FetchedBytes += o.FetchedBytes
	s.PrefetchedBytes += o.PrefetchedBytes
	s.TransferredBytes += o.TransferredBytes
	s.ReadBytes += o.ReadBytes
	s.Hits += o.Hits
	s.Misses += o.Misses
	s.FetchWait += o.FetchWait
	s.FetchErrors += o.FetchErrors
	s.MetadataRequests += o.MetadataRequests
}

// layerStats is updated on the read path without locks. Methods accept a
// nil receiver for readers that do not account (ChunkCache.ReadChunk).
type layerStats struct {
	imageBytes, fetched, prefetched, read, transferred atomic.Int64
	hits, misses, errors, requests                     atomic.Uint64
	waitNanos                                          atomic.Int64
}

func (s *layerStats) hit() {
	if s != nil {
		s.hits.Add(1)
	}
}

func (s *layerStats) miss(wait time.Duration) {
	if s != nil {
		s.misses.Add(1)
		s.waitNanos.Add(int64(wait))
	}
}

func (s *layerStats) addFetched(n, stored int64, prefetch bool) {
	if s != nil {
		s.fetched.Add(n)
		s.transferred.Add(stored)
		if prefetch {
			s.prefetched.Add(n)
		}
	}
}

func (s *layerStats) failed() {
	if s != nil {
		s.errors.Add(1)
	}
}

func (s *layerStats) request() {
	if s != nil {
		s.requests.Add(1)
	}
}

func (s *layerStats) served(n int) {
	if s != nil {
		s.read.Add(int64(n))
	}
}

func (s *layerStats) snapshot() Stats {
	return Stats{
		ImageBytes:       s.imageBytes.Load(),
		FetchedBytes:     s.fetched.Load(),
		PrefetchedBytes:  s.prefetched.Load(),
		TransferredBytes: s.transferred.Load(),
		ReadBytes:        s.read.Load(),
		Hits:             s.hits.Load(),
		Misses:           s.misses.Load(),
		FetchWait:        time.Duration(s.waitNanos.Load()),
		FetchErrors:      s.errors.Load(),
		MetadataRequests: s.requests.Load(),
	}
}

// stats returns the (cumulative, surviving remounts) counters of a layer.
func (m *Mounter) stats(d blob.Digest) *layerStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.layerStats[d]
	if s == nil {
		s = &layerStats{}
		m.layerStats[d] = s
	}
	return s
}

// LayerStats returns the counters of a layer this Mounter has mounted.
func (m *Mounter) LayerStats(d blob.Digest) (Stats, bool) {
	m.mu.Lock()
	s := m.layerStats[d]
	m.mu.Unlock()
	if s == nil {
		return Stats{}, false
	}
	return s.snapshot(), true
}

// SetImage names the layers of an image for ImageStats and /metrics.
// A layer shared by several images counts fully in each of them.
func (m *Mounter) SetImage(key string, layers []blob.Digest) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.images[key] = append([]blob.Digest(nil), layers...)
}

// ForgetImage drops an image key.
func (m *Mounter) ForgetImage(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.images, key)
}

// ImageStats sums the counters of the image's layers.
func (m *Mounter) ImageStats(key string) (Stats, bool) {
	m.mu.Lock()
	layers, ok := m.images[key]
	var ss []*layerStats
	for _, d := range layers {
		if s := m.layerStats[d]; s != nil {
			ss = append(ss, s)
		}
	}
	m.mu.Unlock()
	var out Stats
	for _, s := range ss {
		out.add(s.snapshot())
	}
	return out, ok
}

type metricDesc struct {
	desc *prometheus.Desc
	typ  prometheus.ValueType
	val  func(Stats) float64
}

func statDescs(scope, label string) []metricDesc {
	d := func(name, help string, typ prometheus.ValueType, val func(Stats) float64) metricDesc {
		return metricDesc{prometheus.NewDesc("dsec_lazyfs_"+scope+"_"+name, help, []string{label}, nil), typ, val}
	}
	return []metricDesc{
		d("image_bytes", "Sum of regular file sizes.", prometheus.GaugeValue, func(s Stats) float64 { return float64(s.ImageBytes) }),
		d("fetched_bytes_total", "Bytes of chunks fetched from the blob store (uncompressed).", prometheus.CounterValue, func(s Stats) float64 { return float64(s.FetchedBytes) }),
		d("transferred_bytes_total", "Bytes the fetches read from the blob store (chunks as stored, compressed where that saved space).", prometheus.CounterValue, func(s Stats) float64 { return float64(s.TransferredBytes) }),
		d("prefetched_bytes_total", "Bytes read from the blob store by prefetch.", prometheus.CounterValue, func(s Stats) float64 { return float64(s.PrefetchedBytes) }),
		d("read_bytes_total", "Bytes served to the kernel by the FUSE daemon.", prometheus.CounterValue, func(s Stats) float64 { return float64(s.ReadBytes) }),
		d("chunk_hits_total", "Chunk lookups served from the node cache.", prometheus.CounterValue, func(s Stats) float64 { return float64(s.Hits) }),
		d("chunk_misses_total", "Chunk lookups that waited for a fetch.", prometheus.CounterValue, func(s Stats) float64 { return float64(s.Misses) }),
		d("cache_hit_ratio", "Chunk hits / lookups.", prometheus.GaugeValue, Stats.HitRatio),
		d("fetch_wait_seconds_total", "Time reads spent waiting for fetches.", prometheus.CounterValue, func(s Stats) float64 { return s.FetchWait.Seconds() }),
		d("fetch_errors_total", "Fetches failed after retries or corrupt.", prometheus.CounterValue, func(s Stats) float64 { return float64(s.FetchErrors) }),
		d("metadata_requests_total", "FUSE requests other than reads served by the daemon.", prometheus.CounterValue, func(s Stats) float64 { return float64(s.MetadataRequests) }),
	}
}

// collector exports per-layer, per-image and node cache metrics.
type collector struct {
	m                 *Mounter
	layer, image      []metricDesc
	capacity, used    *prometheus.Desc
	evictions, pinned *prometheus.Desc
	uncached, mounted *prometheus.Desc
}

// Collector returns a Prometheus collector for the Mounter's stats and its
// chunk cache. Register it once.
func (m *Mounter) Collector() prometheus.Collector {
	nd := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("dsec_lazyfs_"+name, help, nil, nil)
	}
	return &collector{
		m:         m,
		layer:     statDescs("layer", "layer"),
		image:     statDescs("image", "image"),
		capacity:  nd("cache_capacity_bytes", "Node chunk cache capacity."),
		used:      nd("cache_used_bytes", "Node chunk cache bytes in use."),
		evictions: nd("cache_evictions_total", "Chunk cache entries evicted."),
		pinned:    nd("cache_pinned_entries", "Chunk cache entries pinned by reads or passthrough files."),
		uncached:  nd("cache_uncached_total", "Fetched chunks served without caching because the cache was full."),
		mounted:   nd("mounted_layers", "Layers mounted on this node."),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range append(append([]metricDesc(nil), c.layer...), c.image...) {
		ch <- d.desc
	}
	for _, d := range []*prometheus.Desc{c.capacity, c.used, c.evictions, c.pinned, c.uncached, c.mounted} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	m.mu.Lock()
	layers := make(map[blob.Digest]*layerStats, len(m.layerStats))
	for d, s := range m.layerStats {
		layers[d] = s
	}
	var images []string
	for k := range m.images {
		images = append(images, k)
	}
	mounted := len(m.mounts)
	m.mu.Unlock()
	sort.Strings(images)
	for d, s := range layers {
		snap := s.snapshot()
		for _, md := range c.layer {
			ch <- prometheus.MustNewConstMetric(md.desc, md.typ, md.val(snap), string(d))
		}
	}
	for _, k := range images {
		snap, _ := m.ImageStats(k)
		for _, md := range c.image {
			ch <- prometheus.MustNewConstMetric(md.desc, md.typ, md.val(snap), k)
		}
	}
	cs := m.cache.Stats()
	ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.GaugeValue, float64(cs.Capacity))
	ch <- prometheus.MustNewConstMetric(c.used, prometheus.GaugeValue, float64(cs.Used))
	ch <- prometheus.MustNewConstMetric(c.evictions, prometheus.CounterValue, float64(cs.Evictions))
	ch <- prometheus.MustNewConstMetric(c.pinned, prometheus.GaugeValue, float64(cs.Pinned))
	ch <- prometheus.MustNewConstMetric(c.uncached, prometheus.CounterValue, float64(cs.Uncached))
	ch <- prometheus.MustNewConstMetric(c.mounted, prometheus.GaugeValue, float64(mounted))
}

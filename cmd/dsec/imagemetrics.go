package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dsec-dev/dsec/internal/api"
)

// imageMetrics exports the per-image lazy-loading figures of this node
// (what `dsec image stats` shows) on /metrics. The figures live in the
// layer daemon and are read at scrape time. They are gauges, not
// counters: they restart from zero when an image's layers are mounted
// again on the node.
type imageMetrics struct {
	stats func(ctx context.Context) ([]api.ImageStats, error)
	log   *slog.Logger
}

var (
	imageBytesDesc = prometheus.NewDesc("dsec_image_bytes",
		"Size of the image's file content.", []string{"image"}, nil)
	imageFetchedDesc = prometheus.NewDesc("dsec_image_fetched_bytes",
		"Bytes of the image fetched from the blob store on this node since its layers were mounted.", []string{"image"}, nil)
	imageTransferredDesc = prometheus.NewDesc("dsec_image_transferred_bytes",
		"Bytes read from the blob store for the image's fetched chunks (as stored: compressed where that saved space).", []string{"image"}, nil)
	imageReadDesc = prometheus.NewDesc("dsec_image_read_bytes",
		"Bytes of the image served through the layer daemon (not counting page cache hits or passthrough reads).", []string{"image"}, nil)
	imageHitsDesc = prometheus.NewDesc("dsec_image_chunk_cache_hits",
		"Chunk reads of the image served from the node chunk cache.", []string{"image"}, nil)
	imageMissesDesc = prometheus.NewDesc("dsec_image_chunk_cache_misses",
		"Chunk reads of the image that had to be fetched.", []string{"image"}, nil)
	imageWaitDesc = prometheus.NewDesc("dsec_image_fetch_wait_seconds",
		"Time reads of the image waited for fetches.", []string{"image"}, nil)
)

func (m imageMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{imageBytesDesc, imageFetchedDesc, imageTransferredDesc, imageReadDesc, imageHitsDesc, imageMissesDesc, imageWaitDesc} {
		ch <- d
	}
}

func (m imageMetrics) Collect(ch chan<- prometheus.Metric) {
	// A scrape must not hang on a stuck daemon.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	all, err := m.stats(ctx)
	if err != nil {
		m.log.Warn("image metrics", "err", err)
		return
	}
	for _, st := range all {
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, st.Image)
		}
		g(imageBytesDesc, float64(st.ImageBytes))
		g(imageFetchedDesc, float64(st.FetchedBytes))
		g(imageTransferredDesc, float64(st.TransferredBytes))
		g(imageReadDesc, float64(st.ReadBytes))
		g(imageHitsDesc, float64(st.CacheHits))
		g(imageMissesDesc, float64(st.CacheMisses))
		g(imageWaitDesc, st.FetchWaitSecs)
	}
}

// AllStats returns the stats of every tagged image.
func (im *images) AllStats(ctx context.Context) ([]api.ImageStats, error) {
	imgs, err := im.st.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.ImageStats, 0, len(imgs))
	for _, img := range imgs {
		st, err := im.Stats(ctx, img.Ref)
		if err != nil {
			return nil, err
		}
		out = append(out, *st)
	}
	return out, nil
}

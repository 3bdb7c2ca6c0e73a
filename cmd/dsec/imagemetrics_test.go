package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dsec-dev/dsec/internal/api"
)

func TestImageMetrics(t *testing.T) {
	m := imageMetrics{log: slog.New(slog.NewTextHandler(io.Discard, nil)), stats: func(context.Context) ([]api.ImageStats, error) {
		return []api.ImageStats{
			{Image: "a:1", ImageBytes: 100, FetchedBytes: 10, TransferredBytes: 4, ReadBytes: 8, CacheHits: 3, CacheMisses: 2, FetchWaitSecs: 0.5},
			{Image: "b:1", ImageBytes: 50},
		}, nil
	}}
	want := `
# HELP dsec_image_fetched_bytes Bytes of the image fetched from the blob store on this node since its layers were mounted.
# TYPE dsec_image_fetched_bytes gauge
dsec_image_fetched_bytes{image="a:1"} 10
dsec_image_fetched_bytes{image="b:1"} 0
# HELP dsec_image_transferred_bytes Bytes read from the blob store for the image's fetched chunks (as stored: compressed where that saved space).
# TYPE dsec_image_transferred_bytes gauge
dsec_image_transferred_bytes{image="a:1"} 4
dsec_image_transferred_bytes{image="b:1"} 0
# HELP dsec_image_fetch_wait_seconds Time reads of the image waited for fetches.
# TYPE dsec_image_fetch_wait_seconds gauge
dsec_image_fetch_wait_seconds{image="a:1"} 0.5
dsec_image_fetch_wait_seconds{image="b:1"} 0
# HELP dsec_image_bytes Size of the image's file content.
# TYPE dsec_image_bytes gauge
dsec_image_bytes{image="a:1"} 100
dsec_image_bytes{image="b:1"} 50
`
	if err := testutil.CollectAndCompare(m, strings.NewReader(want), "dsec_image_fetched_bytes", "dsec_image_transferred_bytes", "dsec_image_fetch_wait_seconds", "dsec_image_bytes"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m); n != 14 {
		t.Fatalf("%d metrics, want 7 per image", n)
	}
	// A failing source yields no metrics (and a log line), not a failed scrape.
	m.stats = func(context.Context) ([]api.ImageStats, error) { return nil, errors.New("boom") }
	if n := testutil.CollectAndCount(m); n != 0 {
		t.Fatalf("%d metrics from a failing source", n)
	}
}

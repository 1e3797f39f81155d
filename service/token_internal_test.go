package service

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/migrate"
)

// TestBearerToken checks that http.token (here from http.token_file)
// guards the status page and /status and leaves the probes and /metrics
// open, and that the Bearer scheme is matched as RFC 9110 writes it:
// without regard to case, one or more spaces before the token.
func TestBearerToken(t *testing.T) {
	pool, dsn := pgtest.NewPool(t)
	ctx := context.Background()
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		t.Fatal(err)
	}
	const token = "s3cret-token-0123456789"
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("test.yaml", []byte(fmt.Sprintf(`
warehouse: {dsn: %q}
http: {token_file: %q}
sources:
  orders:
    table: {name: public.orders, key: [id], event_time: ts, ingested_at: loaded}
`, dsn, file)), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	h := &handler{log: slog.New(slog.DiscardHandler), cfg: cfg, pool: pool, reg: prometheus.NewRegistry(),
		now: func() time.Time { return time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC) }}
	h.schemaReady.Store(true)
	srv := httptest.NewServer(h.mux())
	t.Cleanup(srv.Close)

	tests := []struct {
		path, auth string
		want       int
	}{
		{"/status", "", http.StatusUnauthorized},
		{"/status", "Bearer wrong-token-0123456789", http.StatusUnauthorized},
		{"/status", "Basic " + token, http.StatusUnauthorized},
		{"/status", "Bearer " + token, http.StatusOK},
		{"/status", "bearer " + token, http.StatusOK},
		{"/status", "BEARER " + token, http.StatusOK},
		{"/status", "Bearer   " + token, http.StatusOK},
		{"/status", "Bearer\t" + token, http.StatusUnauthorized},
		{"/status", "Bearer" + token, http.StatusUnauthorized},
		{"/status", "Bearer " + token + "0", http.StatusUnauthorized},
		{"/status", "Bearer " + token[:len(token)-1], http.StatusUnauthorized},
		{"/status", "Bearer " + token + " " + token, http.StatusUnauthorized},
		{"/status", "Bearers " + token, http.StatusUnauthorized},
		{"/status", token, http.StatusUnauthorized},
		{"/", "", http.StatusUnauthorized},
		{"/", "Bearer " + token, http.StatusOK},
		{"/", "bearer  " + token, http.StatusOK},
		{"/elsewhere", "Bearer " + token, http.StatusNotFound},
		{"/healthz", "", http.StatusOK},
		{"/metrics", "", http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.path+" "+tt.auth, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodGet, srv.URL+tt.path, nil)
			if tt.auth != "" {
				req.Header.Set("Authorization", tt.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.want, body)
			}
			if tt.want == http.StatusUnauthorized {
				if !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") || strings.Contains(string(body), token) {
					t.Errorf("refusal: header %q body %q", resp.Header.Get("WWW-Authenticate"), body)
				}
			}
		})
	}
}

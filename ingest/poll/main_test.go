package poll_test

import (
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testNow is the service clock of these tests: event times are generated
// around it, never around today's date.
var testNow = time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC)

package events

import (
	"testing"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
)

// TestMain points DATABASE_URL at a fresh, migrated schema for the
// examples.
func TestMain(m *testing.M) { testdb.Main(testdb.Examples(m)) }

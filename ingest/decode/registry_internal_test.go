package decode

import (
	"container/list"
	"testing"
)

// TestRegistryCacheBounded checks that the cache keeps at most its limit
// of schemas, evicting the least recently used.
func TestRegistryCacheBounded(t *testing.T) {
	g := &Registry{lru: list.New(), byID: map[int]*list.Element{}, limit: 2}
	g.store(&schemaEntry{id: 1})
	g.store(&schemaEntry{id: 2})
	if g.cached(1) == nil { // 1 is now the most recently used
		t.Fatal("schema 1 not cached")
	}
	g.store(&schemaEntry{id: 3})
	if g.Len() != 2 || g.cached(2) != nil || g.cached(1) == nil || g.cached(3) == nil {
		t.Errorf("after a third schema: %d cached, 1 %v, 2 %v, 3 %v", g.Len(), g.cached(1) != nil, g.cached(2) != nil, g.cached(3) != nil)
	}
}

// TestWireID checks the Confluent header.
func TestWireID(t *testing.T) {
	for _, tt := range []struct {
		v  []byte
		id int
		ok bool
	}{
		{[]byte{0, 0, 0, 1, 2, 9}, 258, true},
		{[]byte{0, 0, 0, 0, 7}, 7, true},
		{[]byte{1, 0, 0, 0, 7}, 0, false},
		{[]byte{0, 0x80, 0, 0, 1}, 0, false}, // negative
		{[]byte{0, 0, 0, 7}, 0, false},
		{[]byte(`{"a":1}`), 0, false},
	} {
		id, _, ok := wireID(tt.v)
		if id != tt.id || ok != tt.ok {
			t.Errorf("wireID(% x) = %d, %v; want %d, %v", tt.v, id, ok, tt.id, tt.ok)
		}
	}
}

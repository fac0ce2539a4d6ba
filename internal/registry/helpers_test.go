package registry

import "testing"

// testClient is a Client with a cache directory of the test's own.
func testClient(t *testing.T, opts ...Option) *Client {
	t.Helper()
	c, err := New(append([]Option{WithCacheDir(t.TempDir())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

package source_test

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/internal/source"
	"github.com/imagepipe/imagepipe/test/harness"
)

func TestOpenS3(t *testing.T) {
	m := harness.StartMinIO(t)
	dir := t.TempDir()
	data := imageBytes(5<<20 + 3) // over minio-go's 5 MiB read buffer
	raw := writeFile(t, dir, "disk.raw", data)
	zst := compress(t, "zstd", raw)
	m.PutFile(t, "images", "tenant/disk.raw", raw)
	m.PutFile(t, "images", "tenant/disk.raw.zst", zst)
	s3 := source.S3Options{Endpoint: m.Endpoint, AccessKey: m.AccessKey, SecretKey: m.SecretKey, Insecure: true}

	for _, tc := range []struct {
		key, path string
		wrapper   convert.Wrapper
	}{
		{"tenant/disk.raw", raw, convert.WrapperNone},
		{"tenant/disk.raw.zst", zst, convert.WrapperZstd},
	} {
		t.Run(tc.key, func(t *testing.T) {
			content, err := os.ReadFile(tc.path)
			if err != nil {
				t.Fatal(err)
			}
			tmp := t.TempDir()
			var lastDone, lastTotal int64
			img := mustOpen(t, "s3://images/"+tc.key, source.Options{
				TempDir:  tmp,
				S3:       s3,
				Checksum: digestOf(content),
				Progress: func(done, total int64) { lastDone, lastTotal = done, total },
			})
			if got := readAll(t, img); !bytes.Equal(got, data) {
				t.Errorf("downloaded bytes differ from the original")
			}
			if img.Digest != digestOf(content) || img.Wrapper != tc.wrapper || img.OriginalSize != int64(len(content)) {
				t.Errorf("got digest %s, wrapper %q, %d bytes; want %s, %q, %d", img.Digest, img.Wrapper, img.OriginalSize, digestOf(content), tc.wrapper, len(content))
			}
			if lastDone != int64(len(content)) || lastTotal != int64(len(content)) {
				t.Errorf("last progress = %d/%d, want %d/%d", lastDone, lastTotal, len(content), len(content))
			}
			img.Close()
			assertEmpty(t, tmp)
		})
	}

	t.Run("environment", func(t *testing.T) {
		t.Setenv("AWS_ENDPOINT_URL", "http://"+m.Endpoint)
		t.Setenv("AWS_ACCESS_KEY_ID", m.AccessKey)
		t.Setenv("AWS_SECRET_ACCESS_KEY", m.SecretKey)
		t.Setenv("AWS_REGION", "us-east-1")
		img := mustOpen(t, "s3://images/tenant/disk.raw", source.Options{})
		if img.Digest != digestOf(data) {
			t.Errorf("digest = %s, want %s", img.Digest, digestOf(data))
		}
	})

	t.Run("missing key", func(t *testing.T) {
		_, err := source.Open(t.Context(), "s3://images/tenant/missing", source.Options{S3: s3})
		if err == nil || !strings.Contains(err.Error(), "s3://images/tenant/missing") {
			t.Errorf("err = %v, want one naming the object", err)
		}
	})

	t.Run("over MaxSize", func(t *testing.T) {
		tmp := t.TempDir()
		_, err := source.Open(t.Context(), "s3://images/tenant/disk.raw", source.Options{S3: s3, TempDir: tmp, MaxSize: 1 << 20})
		if re := reject.As(err); re == nil || re.Reason != reject.VirtualSize {
			t.Errorf("err = %v, want a %s rejection", err, reject.VirtualSize)
		}
		assertEmpty(t, tmp)
	})

	t.Run("wrong secret", func(t *testing.T) {
		bad := s3
		bad.SecretKey = "wrong"
		if _, err := source.Open(t.Context(), "s3://images/tenant/disk.raw", source.Options{S3: bad}); err == nil {
			t.Errorf("opened with a wrong secret key")
		}
	})
}

// TestS3EndpointScheme: an endpoint URL's scheme decides between HTTP and
// HTTPS whatever S3Options.Insecure says, and a bare host:port follows
// Insecure.
func TestS3EndpointScheme(t *testing.T) {
	m := harness.StartMinIO(t)
	data := imageBytes(64 << 10)
	m.PutFile(t, "images", "disk.raw", writeFile(t, t.TempDir(), "disk.raw", data))
	for _, tc := range []struct {
		endpoint string
		insecure bool
		ok       bool
	}{
		{"http://" + m.Endpoint, false, true},
		{"HTTP://" + m.Endpoint + "/", false, true},
		{"https://" + m.Endpoint, true, false}, // MinIO speaks plain HTTP here
		{m.Endpoint, true, true},
		{m.Endpoint, false, false},
	} {
		t.Run(tc.endpoint+"/insecure="+fmt.Sprint(tc.insecure), func(t *testing.T) {
			s3 := source.S3Options{Endpoint: tc.endpoint, AccessKey: m.AccessKey, SecretKey: m.SecretKey, Region: "us-east-1", Insecure: tc.insecure}
			img, err := source.Open(t.Context(), "s3://images/disk.raw", source.Options{S3: s3})
			if tc.ok != (err == nil) {
				t.Fatalf("err = %v, want success %v", err, tc.ok)
			}
			if err == nil {
				defer img.Close()
				if img.Digest != digestOf(data) {
					t.Errorf("digest %s, want %s", img.Digest, digestOf(data))
				}
			}
		})
	}
	_, err := source.Open(t.Context(), "s3://images/disk.raw", source.Options{S3: source.S3Options{Endpoint: "http://" + m.Endpoint + "/bucket-prefix"}})
	if err == nil || !strings.Contains(err.Error(), "has a path") {
		t.Errorf("endpoint with a path: err = %v, want a refusal", err)
	}
}

// TestS3OverTLS: MinIO serving HTTPS with a private CA is refused without
// CAFile and read with it, or with InsecureSkipVerify.
func TestS3OverTLS(t *testing.T) {
	m := harness.StartMinIOWith(t, harness.MinIOOptions{TLS: true})
	data := imageBytes(64 << 10)
	m.PutFile(t, "images", "disk.raw", writeFile(t, t.TempDir(), "disk.raw", data))
	s3 := source.S3Options{Endpoint: "https://" + m.Endpoint, AccessKey: m.AccessKey, SecretKey: m.SecretKey, Region: "us-east-1"}

	_, err := source.Open(t.Context(), "s3://images/disk.raw", source.Options{S3: s3})
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Errorf("without CAFile: err = %v, want an x509.UnknownAuthorityError", err)
	}
	for name, opts := range map[string]source.Options{
		"CAFile":             {S3: s3, CAFile: m.CAFile},
		"InsecureSkipVerify": {S3: s3, InsecureSkipVerify: true},
		"bare host:port":     {S3: source.S3Options{Endpoint: m.Endpoint, AccessKey: m.AccessKey, SecretKey: m.SecretKey, Region: "us-east-1"}, CAFile: m.CAFile},
	} {
		t.Run(name, func(t *testing.T) {
			img := mustOpen(t, "s3://images/disk.raw", opts)
			if img.Digest != digestOf(data) {
				t.Errorf("digest %s, want %s", img.Digest, digestOf(data))
			}
		})
	}
}

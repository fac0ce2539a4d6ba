package harness

import (
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// MinIO is a running single-drive MinIO server speaking plain HTTP.
type MinIO struct {
	Endpoint             string // 127.0.0.1:PORT
	AccessKey, SecretKey string

	logPath string
}

// StartMinIO starts MinIO on free ports of 127.0.0.1 (S3 API and console) with its data in
// t.TempDir(), waits for /minio/health/cluster, and stops it when the test ends. It skips the test
// when the minio binary is not built.
func StartMinIO(t testing.TB) *MinIO {
	t.Helper()
	bin := Binary(t, "minio")
	dir := t.TempDir()
	logPath := filepath.Join(dir, "minio.log")
	m := &MinIO{AccessKey: "imagepipe", SecretKey: randomHex(16), logPath: logPath}
	env := []string{
		"MINIO_ROOT_USER=" + m.AccessKey,
		"MINIO_ROOT_PASSWORD=" + m.SecretKey,
		"MINIO_UPDATE=off",
		"MINIO_CI_CD=on", // a test server: no checks meant for production drives
	}
	probe := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

	var p *proc
	t.Cleanup(func() {
		if p != nil {
			if err := p.stop(); err != nil {
				t.Errorf("stopping minio: %v", err)
			}
		}
		logOnFailure(t, "minio", logPath)
	})
	var err error
	for range startAttempts {
		m.Endpoint = net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
		console := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
		p, err = startProc(logPath, env, bin, "server", filepath.Join(dir, "data"),
			"--address", m.Endpoint, "--console-address", console)
		if err != nil {
			break
		}
		// health/cluster answers 200 only once the object layer can serve
		// requests; health/live answers earlier.
		url := "http://" + m.Endpoint + "/minio/health/cluster"
		err = waitReady(p, httpAnswers(probe, url, nil, http.StatusOK))
		if !errors.Is(err, errExited) {
			break
		}
	}
	if err != nil {
		t.Fatalf("starting minio: %v", err)
	}
	return m
}

// LogPath is the file holding MinIO's stdout and stderr.
func (m *MinIO) LogPath() string { return m.logPath }

// PutFile uploads the file at path as bucket/key, creating the bucket if needed.
func (m *MinIO) PutFile(t testing.TB, bucket, key, path string) {
	t.Helper()
	ctx := t.Context()
	client := m.client(t)
	exists, err := client.BucketExists(ctx, bucket)
	if err != nil {
		t.Fatalf("checking bucket %s: %v", bucket, err)
	}
	if !exists {
		if err := client.MakeBucket(ctx, bucket, minio.MakeBucketOptions{}); err != nil {
			t.Fatalf("creating bucket %s: %v", bucket, err)
		}
	}
	if _, err := client.FPutObject(ctx, bucket, key, path, minio.PutObjectOptions{}); err != nil {
		t.Fatalf("uploading %s to %s/%s: %v", path, bucket, key, err)
	}
}

// client returns a minio-go client for m whose idle connections close when the test ends.
func (m *MinIO) client(t testing.TB) *minio.Client {
	t.Helper()
	transport, err := minio.DefaultTransport(false)
	if err != nil {
		t.Fatalf("making minio transport: %v", err)
	}
	t.Cleanup(transport.CloseIdleConnections)
	client, err := minio.New(m.Endpoint, &minio.Options{
		Creds:     credentials.NewStaticV4(m.AccessKey, m.SecretKey, ""),
		Transport: transport,
	})
	if err != nil {
		t.Fatalf("making minio client: %v", err)
	}
	return client
}

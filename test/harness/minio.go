package harness

import (
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// MinIO is a running single-drive MinIO server, speaking plain HTTP unless
// started with MinIOOptions.TLS.
type MinIO struct {
	Endpoint             string // 127.0.0.1:PORT
	AccessKey, SecretKey string
	// CAFile is the PEM of the CA that signed the server's certificate
	// when it speaks HTTPS, else "".
	CAFile string

	logPath string
}

// MinIOOptions configures StartMinIOWith. The zero value is a plain-HTTP
// server.
type MinIOOptions struct {
	// TLS serves HTTPS with a certificate for 127.0.0.1 and localhost that
	// a CA made in Go signs (MinIO.CAFile).
	TLS bool
}

// StartMinIO starts MinIO on free ports of 127.0.0.1 (S3 API and console) with its data in
// t.TempDir(), waits for /minio/health/cluster, and stops it when the test ends. It skips the test
// when the minio binary is not built.
func StartMinIO(t T) *MinIO {
	t.Helper()
	return StartMinIOWith(t, MinIOOptions{})
}

// StartMinIOWith is StartMinIO with options.
func StartMinIOWith(t T, opts MinIOOptions) *MinIO {
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
	transport := &http.Transport{DisableKeepAlives: true}
	scheme := "http"
	// MinIO finds its certificate and key by these names in --certs-dir.
	certsDir := filepath.Join(dir, "certs")
	if opts.TLS {
		scheme = "https"
		certs, err := writeCerts(t.TempDir())
		if err != nil {
			t.Fatalf("making MinIO certificates: %v", err)
		}
		m.CAFile = certs.CA
		if err := os.MkdirAll(certsDir, 0o700); err != nil {
			t.Fatal(err)
		}
		for from, to := range map[string]string{certs.Cert: "public.crt", certs.Key: "private.key"} {
			if err := os.Rename(from, filepath.Join(certsDir, to)); err != nil {
				t.Fatal(err)
			}
		}
		pool, err := certPool(certs.CA)
		if err != nil {
			t.Fatal(err)
		}
		transport.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	probe := &http.Client{Transport: transport}

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
		args := []string{"server", filepath.Join(dir, "data"), "--address", m.Endpoint, "--console-address", console}
		if opts.TLS {
			args = append(args, "--certs-dir", certsDir)
		}
		p, err = startProc(logPath, env, bin, args...)
		if err != nil {
			break
		}
		// health/cluster answers 200 only once the object layer can serve
		// requests; health/live answers earlier.
		url := scheme + "://" + m.Endpoint + "/minio/health/cluster"
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
func (m *MinIO) PutFile(t T, bucket, key, path string) {
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
func (m *MinIO) client(t T) *minio.Client {
	t.Helper()
	secure := m.CAFile != ""
	transport, err := minio.DefaultTransport(secure)
	if err != nil {
		t.Fatalf("making minio transport: %v", err)
	}
	if secure {
		pool, err := certPool(m.CAFile)
		if err != nil {
			t.Fatal(err)
		}
		transport.TLSClientConfig.RootCAs = pool
	}
	t.Cleanup(transport.CloseIdleConnections)
	client, err := minio.New(m.Endpoint, &minio.Options{
		Creds:     credentials.NewStaticV4(m.AccessKey, m.SecretKey, ""),
		Secure:    secure,
		Transport: transport,
	})
	if err != nil {
		t.Fatalf("making minio client: %v", err)
	}
	return client
}

package source

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// defaultS3Endpoint is used when neither S3Options nor the environment
// names an endpoint.
const defaultS3Endpoint = "s3.amazonaws.com"

// openS3 downloads s3://bucket/key: StatObject for the size, then one GET
// of exactly that version, resumed with Range requests after a failure.
func openS3(ctx context.Context, spec string, o *config) (*Image, error) {
	bucket, key, err := parseS3(spec)
	if err != nil {
		return nil, err
	}
	client, err := o.s3Client()
	if err != nil {
		return nil, err
	}
	info, err := client.StatObject(ctx, bucket, key, minio.StatObjectOptions{})
	if err != nil {
		return nil, fmt.Errorf("looking up the object: %w", err)
	}
	if info.Size > o.maxSize {
		return nil, tooLarge(info.Size, o.maxSize)
	}
	get := func(ctx context.Context, off int64) (io.ReadCloser, error) {
		var opts minio.GetObjectOptions
		if info.ETag != "" {
			if err := opts.SetMatchETag(info.ETag); err != nil {
				return nil, err
			}
		}
		if off > 0 {
			if err := opts.SetRange(off, 0); err != nil {
				return nil, err
			}
		}
		body, _, _, err := client.GetObject(ctx, bucket, key, opts)
		return body, err
	}
	first, err := get(ctx, 0)
	if err != nil {
		return nil, fmt.Errorf("downloading the object: %w", err)
	}
	body := &resumingReader{
		ctx:  ctx,
		body: first,
		size: info.Size,
		log:  o.log,
		reopen: func(ctx context.Context, off int64) (io.ReadCloser, bool, error) {
			rc, err := get(ctx, off)
			if err != nil {
				code := minio.ToErrorResponse(err).Code
				if code == "PreconditionFailed" {
					return nil, true, fmt.Errorf("the object has changed since the download began: %w", err)
				}
				return nil, ctx.Err() != nil || code == "NoSuchKey", err
			}
			return rc, false, nil
		},
	}
	defer body.Close()
	o.log.Debug("downloading", "bucket", bucket, "key", key, "bytes", info.Size)
	return o.spool(ctx, body, info.Size, nil)
}

// parseS3 splits s3://bucket/key.
func parseS3(spec string) (bucket, key string, err error) {
	rest := spec[len("s3://"):]
	bucket, key, _ = strings.Cut(rest, "/")
	if bucket == "" || key == "" {
		return "", "", errors.New("an S3 source must have the form s3://bucket/key")
	}
	return bucket, key, nil
}

// s3Client builds a client from S3Options and the AWS_* environment.
func (o *config) s3Client() (*minio.Core, error) {
	s := o.S3
	endpoint := firstNonEmpty(s.Endpoint, os.Getenv("AWS_ENDPOINT_URL_S3"), os.Getenv("AWS_ENDPOINT_URL"), defaultS3Endpoint)
	secure := !s.Insecure
	if strings.Contains(endpoint, "://") {
		u, err := url.Parse(endpoint)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, fmt.Errorf("the S3 endpoint %q is neither host[:port] nor an http(s) URL", DisplayName(endpoint))
		}
		if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
			// minio-go addresses buckets from the host's root; a path would
			// be dropped without a word.
			return nil, fmt.Errorf("the S3 endpoint %q has a path, query or user; give scheme://host[:port] only", u.Redacted())
		}
		endpoint, secure = u.Host, u.Scheme == "https"
	}
	accessKey := firstNonEmpty(s.AccessKey, os.Getenv("AWS_ACCESS_KEY_ID"))
	secretKey := firstNonEmpty(s.SecretKey, os.Getenv("AWS_SECRET_ACCESS_KEY"))
	token := firstNonEmpty(s.SessionToken, os.Getenv("AWS_SESSION_TOKEN"))
	var creds *credentials.Credentials
	if accessKey != "" && secretKey != "" {
		creds = credentials.NewStaticV4(accessKey, secretKey, token)
	} else {
		// The shared credentials file, then instance, task or web-identity
		// roles; anonymous access to public buckets when none answers.
		creds = credentials.NewChainCredentials([]credentials.Provider{
			&credentials.EnvAWS{},
			&credentials.FileAWSCredentials{},
			&credentials.IAM{},
		})
	}
	mo := &minio.Options{
		Creds:  creds,
		Secure: secure,
		Region: firstNonEmpty(s.Region, os.Getenv("AWS_REGION"), os.Getenv("AWS_DEFAULT_REGION")),
	}
	if o.HTTPClient != nil && o.HTTPClient.Transport != nil {
		mo.Transport = o.HTTPClient.Transport
	} else {
		// minio-go's own transport, which never asks for gzip (it would
		// change the bytes of an object stored with Content-Encoding gzip),
		// with CAFile's roots or InsecureSkipVerify.
		t, err := minio.DefaultTransport(secure)
		if err != nil {
			return nil, fmt.Errorf("configuring the S3 transport: %w", err)
		}
		if o.tls != nil && secure {
			t.TLSClientConfig = o.tls.Clone()
		}
		mo.Transport = t
	}
	if secure {
		mo.Transport = unknownCAFailsFast{mo.Transport}
	}
	c, err := minio.NewCore(endpoint, mo)
	if err != nil {
		return nil, fmt.Errorf("configuring the S3 client for %s: %w", endpoint, err)
	}
	return c, nil
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// unknownCAFailsFast makes a server certificate of an unknown CA fail an
// S3 request at once. minio-go retries every failed request for seconds
// except one whose error is an x509.UnknownAuthorityError, which Go wraps
// in a *tls.CertificateVerificationError: this hands it over unwrapped.
type unknownCAFailsFast struct{ inner http.RoundTripper }

func (t unknownCAFailsFast) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.inner.RoundTrip(req)
	var unknown x509.UnknownAuthorityError
	if err != nil && errors.As(err, &unknown) {
		return nil, unknown
	}
	return resp, err
}

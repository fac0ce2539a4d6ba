module github.com/imagepipe/imagepipe/test/zstdref

go 1.23

require github.com/klauspost/compress v1.17.9

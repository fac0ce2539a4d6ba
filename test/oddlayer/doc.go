// Package oddlayer builds the containerDisk layers that tools other than
// imagectl, and tenants out to confuse, make of one disk, each with what
// image-gate must make of it: imagepipe's tar with PAX records of every
// kind, GNU long names and links, owner names, GNU headers and padding;
// imagepipe's tar in gzip streams with every optional header field,
// several members or bytes after them, and in zstd streams with skippable
// or several frames. A case is refused with a reason, or accepted with a
// canonical layer that imagepipe wrote; the pushed layer stands as the
// canonical one only where its tar and its compression framing are
// imagepipe's.
package oddlayer

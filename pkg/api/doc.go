// Package api holds imagepipe's public data types: the JSON and YAML models
// that imagectl prints and that scripts depend on. It contains no logic and
// imports nothing internal, so its types stay stable.
package api

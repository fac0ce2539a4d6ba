// Package cdi is the hub side of imagepipe: it learns of tenant images from
// registry webhooks and polling, and keeps each one replicated onto a hub
// cluster as a CDI DataVolume and DataSource, reported in a BaseImage.
//
// This first part holds webhook intake: parsing the notifications of the
// CNCF distribution registry, Harbor and Quay into Events, and the HTTP
// handler that authenticates and bounds them.
package cdi

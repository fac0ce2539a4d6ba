package main

import (
	"bytes"
	"fmt"
	"os"
	"regexp"

	"go.yaml.in/yaml/v3"
)

var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// pinImage sets the images: entry of the kustomization at path whose name
// is imageName to newName@digest, as `kustomize edit set image
// imageName=newName@digest` writes it: newName and digest, and no
// newTag. It adds the entry (and images:) when there is none, and keeps
// the file's comments and everything else in it.
func pinImage(path, imageName, newName, digest string) error {
	if !digestPattern.MatchString(digest) {
		return fmt.Errorf("pinning %s: %q is not a sha256 digest", imageName, digest)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading the kustomization: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("parsing %s: %w", path, err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return fmt.Errorf("parsing %s: not a kustomization (a YAML mapping)", path)
	}
	root := doc.Content[0]
	images := mappingValue(root, "images")
	if images == nil {
		images = &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		root.Content = append(root.Content, scalar("images"), images)
	}
	if images.Kind != yaml.SequenceNode {
		return fmt.Errorf("parsing %s: images is not a list", path)
	}
	var entry *yaml.Node
	for _, e := range images.Content {
		if n := mappingValue(e, "name"); n != nil && n.Value == imageName {
			entry = e
			break
		}
	}
	if entry == nil {
		entry = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Content: []*yaml.Node{scalar("name"), scalar(imageName)}}
		images.Content = append(images.Content, entry)
	}
	setMapping(entry, "newName", newName)
	deleteMapping(entry, "newTag")
	setMapping(entry, "digest", digest)

	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := enc.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, out.Bytes(), info.Mode().Perm()); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

func scalar(v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v} }

// mappingValue is the value of key in the mapping m, or nil.
func mappingValue(m *yaml.Node, key string) *yaml.Node {
	if m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

func setMapping(m *yaml.Node, key, value string) {
	if v := mappingValue(m, key); v != nil {
		*v = *scalar(value)
		return
	}
	m.Content = append(m.Content, scalar(key), scalar(value))
}

func deleteMapping(m *yaml.Node, key string) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content = append(m.Content[:i], m.Content[i+2:]...)
			return
		}
	}
}

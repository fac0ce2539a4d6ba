// Command image-syncer will replicate registry images onto a hub cluster as
// CDI DataVolumes and DataSources. It is not built yet.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "image-syncer is not built yet; see the README for what works today")
	os.Exit(1)
}

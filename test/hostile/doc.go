// Package hostile holds the hostile-image corpus: malicious and malformed disk images built at test time, each of which the disk engine must reject with the right reason.
package hostile

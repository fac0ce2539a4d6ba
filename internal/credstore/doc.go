// Package credstore reads and writes registry credentials where docker,
// crane, skopeo and internal/registry's default keychain find them: the
// docker config file ($DOCKER_CONFIG/config.json, else
// ~/.docker/config.json) or the credential helper it names. Read takes a
// given config file and runs no helper, for the daemons' mounted
// secrets; Save and Erase are imagectl login and logout.
package credstore

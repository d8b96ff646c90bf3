// Package nodepbconnect is the generated Connect client and handler of the
// node service (api/node/v1/node.proto, `make gen`); edit the .proto, not
// this package.
package nodepbconnect

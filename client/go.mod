module github.com/agentenv/agentenv/client

go 1.22

require (
	connectrpc.com/connect v1.18.1
	github.com/agentenv/agentenv/api v0.0.0
)

require google.golang.org/protobuf v1.36.6 // indirect

// The client and its wire types are released together from this
// repository: the api module is used as it is beside this one.
replace github.com/agentenv/agentenv/api => ../api

module github.com/agentenv/agentenv/client

go 1.22

require (
	connectrpc.com/connect v1.18.1
	google.golang.org/protobuf v1.36.6
)

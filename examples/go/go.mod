// A small tiermem client (docs/integrations.md). With the module proxy: `go mod tidy && go run .`;
// tests/test_go_client.py builds it offline against Debian's Go packages instead (GOPATH mode).
module github.com/tiermem/tiermem/examples/go

go 1.19

require (
	github.com/tiermem/tiermem/gen/go v0.0.0
	google.golang.org/grpc v1.33.3
)

replace github.com/tiermem/tiermem/gen/go => ../../gen/go

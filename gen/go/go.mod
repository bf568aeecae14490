// The generated Go stubs of tiermem.v1 (buf.gen.yaml, `make go-stubs`); import them as
// github.com/tiermem/tiermem/gen/go/tiermem/v1.
module github.com/tiermem/tiermem/gen/go

go 1.19

require (
	google.golang.org/grpc v1.33.3
	google.golang.org/protobuf v1.28.1
)

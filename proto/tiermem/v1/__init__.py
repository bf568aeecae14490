"""Generated Protobuf and gRPC stubs for tiermem.v1 (regenerate with `make proto`)."""

"""Generated protobuf/gRPC modules for package hetspec.v1 (python -m protocol.gen_proto; never edit)."""

"""gRPC services: `hetspec.v1.Generation` (streaming generation) and `hetspec.v1.Drafter` (drafter sessions)."""

"""A local page and HTTP API over every trainer's checkpoints (docs/serve.md)."""

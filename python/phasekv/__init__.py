"""phasekv: chunked KV-cache compression and per-phase evaluation (Python side)."""

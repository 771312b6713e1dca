"""Kafka (and embedded-source) offset tracking that records input divisions (imports storage, circuits)."""

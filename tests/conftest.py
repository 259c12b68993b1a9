"""Shared fixtures. The session-wide real Kafka broker lives here (see online.kafka_broker)."""

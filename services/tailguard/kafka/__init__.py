"""The Kafka client layer: configuration, producers, consumers, signing, the topics."""
